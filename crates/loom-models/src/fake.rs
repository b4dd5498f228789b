//! The scripted fake model (`sdk: fake`).
//!
//! `params.script` is a list of replies. The reply used for a request is the one whose index is
//! the number of assistant messages since the last real user message, after filtering the script
//! by its conditions. As in the reference, engine notes are not real user messages: the finalize
//! hint, a system note, and the repair request that gives a refused answer back to its author
//! with a check's diagnostic ([`loom_core::model::is_engine_note`]). So a script
//! `[bad answer, good answer]` answers a contract's or a judge's repair with its second reply,
//! and `with_text`/`without_text` read the last real user message: a judge's single message
//! (criteria, context, output), a role's input, the run's request.
//!
//! | key | meaning |
//! |---|---|
//! | `text` | the answer's text; `{{ tool_result }}` is replaced by the text of the last tool result (without the engine's `[result:N]` marker), `{{ system }}` by the request's system prompt |
//! | `tool_calls` | `[{name, arguments}]`, call ids `fake_<turn>_<i>`; `{{ tool_result }}` in a string of the arguments is replaced as in `text` (a script hands one tool's result to the next tool) |
//! | `reasoning` | a reasoning block before the text |
//! | `with_tool` / `without_tool` | keep the reply only if that tool is (not) offered |
//! | `with_text` / `without_text` | keep the reply only if the last user text contains (lacks) it |
//! | `forced` | text used instead when tools are forbidden (`tool_choice: none`) |
//! | `error` | fail every attempt with that error kind (`transient`, `auth`, …) |
//!
//! Without a script the model echoes: `Echo: <last user text>`. Usage is estimated like the
//! reference: `input = len(request JSON) / 4`, `output = len(message JSON) / 4`.

use std::{fmt, sync::Arc};

use futures_util::stream;
use loom_core::{
    BoxStream, Message, Role,
    content::BlockKind,
    limits::json_bytes,
    model::{
        ModelChunk, ModelClient, ModelError, ModelErrorKind, ModelRequest, StopReason, ToolChoice,
    },
    usage::Usage,
};
use serde::Deserialize;
use serde_json::{Map, Value};

/// Characters per estimated token.
const CHARS_PER_TOKEN: usize = 4;

/// A scripted model.
#[derive(Clone)]
pub struct FakeModel {
    name: String,
    script: Option<Vec<Reply>>,
}

impl fmt::Debug for FakeModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeModel")
            .field("name", &self.name)
            .field("replies", &self.script.as_ref().map(Vec::len))
            .finish()
    }
}

/// One scripted reply.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reply {
    #[serde(default)]
    text: String,
    #[serde(default)]
    tool_calls: Vec<ScriptedCall>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    with_tool: Option<String>,
    #[serde(default)]
    without_tool: Option<String>,
    #[serde(default)]
    with_text: Option<String>,
    #[serde(default)]
    without_text: Option<String>,
    #[serde(default)]
    forced: Option<String>,
    #[serde(default)]
    error: Option<ModelErrorKind>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptedCall {
    name: String,
    #[serde(default = "empty_object")]
    arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

/// A `params.script` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("params.script{path}: {message}")]
pub struct FakeScriptError {
    /// Where in the script (`[2].tool_calls`), empty for the whole script.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl FakeModel {
    /// A fake model named `name` (the provider model name) configured by `params`.
    pub fn from_params(
        name: impl Into<String>,
        params: &Map<String, Value>,
    ) -> Result<FakeModel, FakeScriptError> {
        let script = match params.get("script") {
            None | Some(Value::Null) => None,
            Some(value) => {
                let replies: Vec<Reply> = serde_path_to_error_free(value)?;
                Some(replies)
            }
        };
        Ok(FakeModel {
            name: name.into(),
            script,
        })
    }

    /// A fake model that echoes the last user text.
    pub fn echo(name: impl Into<String>) -> FakeModel {
        FakeModel {
            name: name.into(),
            script: None,
        }
    }

    fn answer(&self, request: &ModelRequest) -> Result<(Message, StopReason), ModelError> {
        let last_user = last_user_text(&request.messages);
        let Some(script) = &self.script else {
            return Ok((
                Message::assistant(format!("Echo: {last_user}")),
                StopReason::End,
            ));
        };
        let offered = |name: &str| request.tools.iter().any(|t| t.name == name);
        let candidates: Vec<&Reply> = script
            .iter()
            .filter(|r| r.with_tool.as_deref().is_none_or(offered))
            .filter(|r| !r.without_tool.as_deref().is_some_and(offered))
            .filter(|r| r.with_text.as_deref().is_none_or(|t| last_user.contains(t)))
            .filter(|r| {
                !r.without_text
                    .as_deref()
                    .is_some_and(|t| last_user.contains(t))
            })
            .collect();
        let turn = turn_index(&request.messages);
        let Some(reply) = candidates.get(turn) else {
            return Err(ModelError::new(
                ModelErrorKind::InvalidRequest,
                format!(
                    "script of model '{}' exhausted: reply #{} requested, {} planned with these tools",
                    self.name,
                    turn + 1,
                    candidates.len()
                ),
            ));
        };
        if let Some(kind) = reply.error {
            return Err(ModelError::new(kind, format!("scripted {kind} error")));
        }
        let mut blocks = Vec::new();
        if let Some(reasoning) = &reply.reasoning {
            blocks.push(loom_core::Block::new(BlockKind::Reasoning {
                text: reasoning.clone(),
                model_id: Some(self.name.clone()),
            }));
        }
        let tools_allowed = request.tool_choice != ToolChoice::None;
        let text = if !tools_allowed && !reply.tool_calls.is_empty() {
            reply.forced.clone().unwrap_or_else(|| reply.text.clone())
        } else {
            reply.text.clone()
        };
        let last_result = last_tool_result(&request.messages);
        let text = text
            .replace("{{ tool_result }}", &last_result)
            .replace("{{ system }}", &request.system);
        if !text.is_empty() {
            blocks.push(loom_core::Block::text(text));
        }
        let mut stop = StopReason::End;
        if tools_allowed {
            for (i, call) in reply.tool_calls.iter().enumerate() {
                let mut arguments = call.arguments.clone();
                replace_in_strings(&mut arguments, &last_result);
                blocks.push(loom_core::Block::tool_call(
                    format!("fake_{turn}_{i}"),
                    call.name.clone(),
                    arguments,
                ));
                stop = StopReason::ToolUse;
            }
        }
        if request.tool_choice == ToolChoice::Required && stop != StopReason::ToolUse {
            return Err(ModelError::new(
                ModelErrorKind::InvalidRequest,
                format!(
                    "script of model '{}': a tool call is required but reply #{} has none",
                    self.name,
                    turn + 1
                ),
            ));
        }
        if blocks.is_empty() {
            blocks.push(loom_core::Block::text(""));
        }
        Ok((
            Message {
                role: Role::Assistant,
                blocks,
            },
            stop,
        ))
    }
}

fn serde_path_to_error_free(value: &Value) -> Result<Vec<Reply>, FakeScriptError> {
    let Value::Array(items) = value else {
        return Err(FakeScriptError {
            path: String::new(),
            message: "must be a list of replies".into(),
        });
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            Reply::deserialize(item).map_err(|e| FakeScriptError {
                path: format!("[{i}]"),
                message: e.to_string(),
            })
        })
        .collect()
}

fn is_engine_note(message: &Message) -> bool {
    loom_core::model::is_engine_note(&message.text())
}

fn last_user_text(messages: &[Arc<Message>]) -> String {
    messages
        .iter()
        .rev()
        .find(|m| m.role == Role::User && !is_engine_note(m))
        .map(|message| message.text())
        .unwrap_or_default()
}

fn last_tool_result(messages: &[Arc<Message>]) -> String {
    for message in messages.iter().rev() {
        for block in message.blocks.iter().rev() {
            if let BlockKind::ToolResult { output, .. } = &block.kind {
                return without_ref_marker(output.visible_text());
            }
        }
    }
    String::new()
}

/// `{{ tool_result }}` replaced by `result` in every string of `value`, keys left alone.
fn replace_in_strings(value: &mut Value, result: &str) {
    match value {
        Value::String(text) if text.contains("{{ tool_result }}") => {
            *text = text.replace("{{ tool_result }}", result);
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| replace_in_strings(item, result)),
        Value::Object(fields) => fields
            .values_mut()
            .for_each(|field| replace_in_strings(field, result)),
        _ => {}
    }
}

/// The result without the `[result:N]` line the engine puts before it when `$ref` is on: the
/// placeholder stands for what the tool answered.
fn without_ref_marker(text: String) -> String {
    let marker = text
        .strip_prefix("[result:")
        .and_then(|rest| rest.split_once("]\n"))
        .filter(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    match marker {
        Some((_, rest)) => rest.to_owned(),
        None => text,
    }
}

/// Assistant messages since the last real user message.
fn turn_index(messages: &[Arc<Message>]) -> usize {
    messages
        .iter()
        .rev()
        .take_while(|m| m.role != Role::User || is_engine_note(m))
        .filter(|m| m.role == Role::Assistant)
        .count()
}

impl ModelClient for FakeModel {
    fn provider(&self) -> &str {
        "fake"
    }

    fn stream(&self, request: &ModelRequest) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
        let (message, stop) = match self.answer(request) {
            Ok(answer) => answer,
            Err(error) => return Box::pin(stream::iter([Err(error)])),
        };
        let input = json_bytes(request) / CHARS_PER_TOKEN;
        let output = json_bytes(&message) / CHARS_PER_TOKEN;
        let mut chunks = Vec::new();
        let mut index = 0;
        for block in message.blocks {
            match block.kind {
                BlockKind::Text { text } => {
                    for piece in split_deltas(&text) {
                        chunks.push(Ok(ModelChunk::TextDelta(piece)));
                    }
                }
                BlockKind::Reasoning { text, .. } => chunks.push(Ok(ModelChunk::ReasoningDelta {
                    text,
                    start: true,
                    provider_meta: Map::new(),
                })),
                BlockKind::ToolCall {
                    call_id,
                    name,
                    arguments,
                } => {
                    chunks.push(Ok(ModelChunk::ToolCallStarted {
                        index,
                        call_id,
                        name,
                    }));
                    let raw = arguments.to_string();
                    let middle = raw
                        .char_indices()
                        .nth(raw.chars().count() / 2)
                        .map_or(0, |(i, _)| i);
                    chunks.push(Ok(ModelChunk::ToolArgsDelta {
                        index,
                        json_fragment: raw[..middle].to_owned(),
                    }));
                    chunks.push(Ok(ModelChunk::ToolArgsDelta {
                        index,
                        json_fragment: raw[middle..].to_owned(),
                    }));
                    chunks.push(Ok(ModelChunk::ToolCallEnded { index }));
                    index += 1;
                }
                _ => {}
            }
        }
        chunks.push(Ok(ModelChunk::Usage(Usage {
            input_tokens: input as u64,
            output_tokens: output as u64,
            ..Usage::default()
        })));
        chunks.push(Ok(ModelChunk::Stopped {
            reason: stop,
            model_id: self.name.clone(),
        }));
        Box::pin(stream::iter(chunks))
    }
}

/// Splits text into word-sized deltas, keeping every character.
fn split_deltas(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        current.push(c);
        if c == ' ' {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tool_result_placeholder_leaves_out_the_ref_marker() {
        assert_eq!(without_ref_marker("[result:12]\n87".into()), "87");
        assert_eq!(without_ref_marker("[result:]\n87".into()), "[result:]\n87");
        assert_eq!(without_ref_marker("87".into()), "87");
    }
    use futures_util::StreamExt;
    use loom_core::model::{ResponseAccumulator, ToolDefinition};
    use serde_json::json;

    fn request(messages: Vec<Message>, tools: &[&str], choice: ToolChoice) -> ModelRequest {
        ModelRequest {
            model_id: "fake-1".into(),
            system: String::new(),
            messages: messages.into_iter().map(Arc::new).collect(),
            tools: tools
                .iter()
                .map(|n| ToolDefinition {
                    name: (*n).into(),
                    description: String::new(),
                    input_schema: json!({}).into(),
                })
                .collect(),
            tool_choice: choice,
            max_tokens: None,
            params: Default::default(),
            output_schema: None,
        }
    }

    async fn collect(
        model: &FakeModel,
        request: ModelRequest,
    ) -> Result<loom_core::model::ModelResponse, ModelError> {
        let mut stream = model.stream(&request);
        let mut acc = ResponseAccumulator::new();
        while let Some(chunk) = stream.next().await {
            acc.push(chunk?);
        }
        acc.finish()
    }

    fn script(value: Value) -> FakeModel {
        let Value::Object(params) = json!({ "script": value }) else {
            unreachable!()
        };
        FakeModel::from_params("fake-1", &params).unwrap()
    }

    #[test]
    fn echo_without_script() {
        let model = FakeModel::echo("e");
        let response = futures_util::FutureExt::now_or_never(collect(
            &model,
            request(vec![Message::user("bonjour")], &[], ToolChoice::Auto),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(response.message.text(), "Echo: bonjour");
        assert!(response.usage.input_tokens > 0);
    }

    #[test]
    fn follows_the_script_by_turn_and_filters() {
        let model = script(json!([
            {"text": "Je calcule.", "tool_calls": [{"name": "calc", "arguments": {"x": 1}}], "with_tool": "calc"},
            {"text": "Résultat : {{ tool_result }}"},
        ]));
        let first = futures_util::FutureExt::now_or_never(collect(
            &model,
            request(vec![Message::user("q")], &["calc"], ToolChoice::Auto),
        ))
        .unwrap()
        .unwrap();
        let calls: Vec<_> = first
            .message
            .tool_calls()
            .map(|(id, n, a)| (id.to_owned(), n.to_owned(), a.clone()))
            .collect();
        assert_eq!(
            calls,
            vec![("fake_0_0".into(), "calc".into(), json!({"x": 1}))]
        );
        assert_eq!(first.stop_reason, StopReason::ToolUse);

        let tool_message = Message {
            role: Role::Tool,
            blocks: vec![loom_core::Block::new(BlockKind::ToolResult {
                call_id: "fake_0_0".into(),
                output: loom_core::tool::ToolOutput::text("42"),
            })],
        };
        let second = futures_util::FutureExt::now_or_never(collect(
            &model,
            request(
                vec![Message::user("q"), first.message, tool_message],
                &["calc"],
                ToolChoice::Auto,
            ),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(second.message.text(), "Résultat : 42");
        // In a call's arguments too, in every string, nested ones included.
        let mut arguments =
            json!({"content": "x = {{ tool_result }}", "n": [1, {"s": "{{ tool_result }}"}]});
        replace_in_strings(&mut arguments, "42");
        assert_eq!(
            arguments,
            json!({"content": "x = 42", "n": [1, {"s": "42"}]})
        );

        // Without the tool offered, the first reply is filtered out.
        let no_tool = futures_util::FutureExt::now_or_never(collect(
            &model,
            request(vec![Message::user("q")], &[], ToolChoice::Auto),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(no_tool.message.text(), "Résultat : ");
    }

    #[test]
    fn a_repair_request_is_not_a_turn_of_the_user() {
        // The reference's contract and judge repairs: the second reply answers the repair, and
        // the filters read the user's request, not the diagnostic.
        let model = script(json!([
            {"text": "prose", "with_text": "fiche"},
            {"text": "{\"total\": 10}", "with_text": "fiche"},
        ]));
        let messages = vec![
            Message::user("La fiche du devis"),
            Message::assistant("prose"),
            Message::user(loom_core::model::repair_message(
                "loom.contract",
                "The output does not meet its contract: not JSON",
            )),
        ];
        let repaired = futures_util::FutureExt::now_or_never(collect(
            &model,
            request(messages, &[], ToolChoice::Auto),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(repaired.message.text(), "{\"total\": 10}");
    }

    #[test]
    fn exhausted_and_errors() {
        let model = script(json!([{"error": "auth"}]));
        let err = futures_util::FutureExt::now_or_never(collect(
            &model,
            request(vec![Message::user("q")], &[], ToolChoice::Auto),
        ))
        .unwrap()
        .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::Auth);
        let model = script(json!([]));
        let err = futures_util::FutureExt::now_or_never(collect(
            &model,
            request(vec![Message::user("q")], &[], ToolChoice::Auto),
        ))
        .unwrap()
        .unwrap_err();
        assert_eq!(err.kind, ModelErrorKind::InvalidRequest);
        assert!(err.message.contains("exhausted"));
    }

    #[test]
    fn bad_script_is_refused() {
        let Value::Object(params) = json!({"script": [{"txt": "x"}]}) else {
            unreachable!()
        };
        let err = FakeModel::from_params("f", &params).unwrap_err();
        assert_eq!(err.path, "[0]");
    }
}
