//! Messages and content blocks, in the journal's shape.
//!
//! A block serializes as `{"cache_breakpoint", "provider_meta", "type", ...fields}`: the common
//! fields first, then the kind's tag and fields, exactly as the reference journal writes them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Who speaks in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The person (or application) asking.
    User,
    /// The model.
    Assistant,
    /// Tool results going back to the model.
    Tool,
}

/// One content block of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Block {
    /// Whether a provider prompt-cache breakpoint follows this block.
    #[serde(default)]
    pub cache_breakpoint: bool,
    /// Provider-specific data that must travel with the block (signatures, item ids).
    #[serde(default)]
    pub provider_meta: Map<String, Value>,
    /// What the block holds.
    #[serde(flatten)]
    pub kind: BlockKind,
}

/// The kinds of content block, discriminated by `type`.
// `ToolResult` carries a whole `ToolOutput` (both views of a result) by value, so that blocks
// stay plain data to match on; the size difference with text blocks is accepted.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockKind {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// Structured data.
    Json {
        /// The value.
        data: Value,
    },
    /// A file stored beside the journal, referenced by URI.
    Artifact {
        /// `artifact://…` URI.
        uri: String,
        /// MIME type.
        media_type: String,
        /// Size in bytes.
        size: u64,
        /// Display name.
        name: Option<String>,
    },
    /// File bytes inline (never written to the journal).
    InlineData {
        /// MIME type.
        media_type: String,
        /// Base64 bytes.
        data: String,
        /// Display name.
        name: Option<String>,
    },
    /// Model reasoning, kept provider-neutral.
    Reasoning {
        /// The reasoning text (may be empty when redacted).
        text: String,
        /// The provider model that produced it.
        model_id: Option<String>,
    },
    /// A tool call proposed by the model.
    ToolCall {
        /// The call id, unique in the response.
        call_id: String,
        /// The tool name as offered to the model.
        name: String,
        /// The arguments as written by the model.
        arguments: Value,
    },
    /// A tool result linked to its call.
    ToolResult {
        /// The call this answers.
        call_id: String,
        /// The result.
        output: crate::tool::ToolOutput,
    },
}

impl Block {
    /// A block of the given kind with default common fields.
    pub fn new(kind: BlockKind) -> Block {
        Block {
            cache_breakpoint: false,
            provider_meta: Map::new(),
            kind,
        }
    }

    /// A text block.
    pub fn text(text: impl Into<String>) -> Block {
        Block::new(BlockKind::Text { text: text.into() })
    }

    /// A JSON block.
    pub fn json(data: Value) -> Block {
        Block::new(BlockKind::Json { data })
    }

    /// A tool-call block.
    pub fn tool_call(
        call_id: impl Into<String>,
        name: impl Into<String>,
        arguments: Value,
    ) -> Block {
        Block::new(BlockKind::ToolCall {
            call_id: call_id.into(),
            name: name.into(),
            arguments,
        })
    }
}

/// A message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// What is said, at least one block.
    pub blocks: Vec<Block>,
}

impl Message {
    /// A user message made of one text block.
    pub fn user(text: impl Into<String>) -> Message {
        Message {
            role: Role::User,
            blocks: vec![Block::text(text)],
        }
    }

    /// An assistant message made of one text block.
    pub fn assistant(text: impl Into<String>) -> Message {
        Message {
            role: Role::Assistant,
            blocks: vec![Block::text(text)],
        }
    }

    /// The concatenated text of the message's text blocks.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for block in &self.blocks {
            if let BlockKind::Text { text } = &block.kind {
                out.push_str(text);
            }
        }
        out
    }

    /// The tool calls of an assistant message, in the order the model wrote them.
    pub fn tool_calls(&self) -> impl Iterator<Item = (&str, &str, &Value)> {
        self.blocks.iter().filter_map(|b| match &b.kind {
            BlockKind::ToolCall {
                call_id,
                name,
                arguments,
            } => Some((call_id.as_str(), name.as_str(), arguments)),
            _ => None,
        })
    }

    /// Checks the structural rules: at least one block, tool results only in `tool` messages,
    /// tool calls and reasoning only in `assistant` messages, no inline bytes.
    pub fn check(&self) -> Result<(), String> {
        if self.blocks.is_empty() {
            return Err("a message needs at least one block".into());
        }
        for block in &self.blocks {
            match (&block.kind, self.role) {
                (BlockKind::ToolResult { .. }, Role::Tool) => {}
                (BlockKind::ToolResult { .. }, _) => {
                    return Err("tool_result blocks belong to tool messages".into());
                }
                (BlockKind::ToolCall { .. } | BlockKind::Reasoning { .. }, Role::Assistant) => {}
                (BlockKind::ToolCall { .. } | BlockKind::Reasoning { .. }, _) => {
                    return Err(
                        "tool_call and reasoning blocks belong to assistant messages".into(),
                    );
                }
                (BlockKind::InlineData { .. }, _) => {
                    return Err("file bytes are not allowed in the journal".into());
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_serializes_in_journal_order() {
        let json = serde_json::to_string(&Block::text("87")).unwrap();
        assert_eq!(
            json,
            r#"{"cache_breakpoint":false,"provider_meta":{},"type":"text","text":"87"}"#
        );
        let back: Block = serde_json::from_str(&json).unwrap();
        assert_eq!(back, Block::text("87"));
    }

    #[test]
    fn unknown_fields_are_ignored_on_read() {
        let back: Block = serde_json::from_str(
            r#"{"cache_breakpoint":false,"provider_meta":{},"type":"text","text":"a","later":1}"#,
        )
        .unwrap();
        assert_eq!(back, Block::text("a"));
    }

    #[test]
    fn message_rules() {
        let bad = Message {
            role: Role::User,
            blocks: vec![Block::tool_call("c", "t", Value::Null)],
        };
        assert!(bad.check().is_err());
        assert!(Message::user("x").check().is_ok());
        assert!(
            Message {
                role: Role::User,
                blocks: vec![]
            }
            .check()
            .is_err()
        );
    }
}
