//! MCP call results turned into Loom tool outputs.

use loom_core::{Block, BlockKind, tool::ToolOutput};
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};

/// Converts a `tools/call` result.
///
/// Text becomes text blocks; images, audio and embedded binary resources become
/// [`BlockKind::InlineData`] blocks (base64 with their media type; a resource is named by the
/// last segment of its URI), which the engine stores as artifacts before anything is
/// journaled; embedded text resources become text blocks, resource links a short text naming
/// them. `structuredContent` becomes `data`, plus a JSON block when the server sent no text
/// (servers usually repeat the structured value as text, and the model should not read it
/// twice). `isError: true` becomes `is_error`.
pub(crate) fn to_output(server: &str, result: CallToolResult) -> ToolOutput {
    let mut blocks = Vec::with_capacity(result.content.len() + 1);
    for content in result.content {
        blocks.push(match content {
            ContentBlock::Text(text) => Block::text(text.text),
            ContentBlock::Image(image) => Block::new(BlockKind::InlineData {
                media_type: image.mime_type,
                data: image.data,
                name: None,
            }),
            ContentBlock::Audio(audio) => Block::new(BlockKind::InlineData {
                media_type: audio.mime_type,
                data: audio.data,
                name: None,
            }),
            ContentBlock::Resource(embedded) => match embedded.resource {
                ResourceContents::TextResourceContents { text, .. } => Block::text(text),
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => Block::new(BlockKind::InlineData {
                    media_type: mime_type.unwrap_or_else(|| "application/octet-stream".into()),
                    data: blob,
                    name: Some(resource_name(&uri)),
                }),
                #[allow(unreachable_patterns)]
                _ => Block::text("[unsupported MCP resource content]"),
            },
            ContentBlock::ResourceLink(resource) => {
                Block::text(format!("[resource {} ({})]", resource.uri, resource.name))
            }
            #[allow(unreachable_patterns)]
            _ => {
                tracing::warn!(server, "MCP result content of an unknown kind ignored");
                Block::text("[unsupported MCP content]")
            }
        });
    }
    let has_text = blocks
        .iter()
        .any(|block| matches!(block.kind, BlockKind::Text { .. }));
    let data = result.structured_content;
    if let Some(value) = &data
        && !has_text
    {
        blocks.push(Block::json(value.clone()));
    }
    ToolOutput {
        blocks,
        data,
        is_error: result.is_error == Some(true),
        ..ToolOutput::default()
    }
}

/// The display name of a resource: the last segment of its URI's path, else the URI.
fn resource_name(uri: &str) -> String {
    let path = uri.split(['?', '#']).next().unwrap_or(uri);
    match path.rsplit('/').next() {
        Some(last) if !last.is_empty() => last.to_owned(),
        _ => uri.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn text_image_structured_error() {
        let mut result = CallToolResult::success(vec![
            ContentBlock::text("hello"),
            ContentBlock::image("iVBO", "image/png"),
            ContentBlock::embedded_text("file:///a.txt", "inside"),
        ]);
        result.structured_content = Some(json!({"n": 1}));
        let output = to_output("s", result);
        assert_eq!(output.blocks.len(), 3);
        assert_eq!(
            output.blocks[0].kind,
            BlockKind::Text {
                text: "hello".into()
            }
        );
        assert_eq!(
            output.blocks[1].kind,
            BlockKind::InlineData {
                media_type: "image/png".into(),
                data: "iVBO".into(),
                name: None
            }
        );
        assert_eq!(
            output.blocks[2].kind,
            BlockKind::Text {
                text: "inside".into()
            }
        );
        assert_eq!(output.data, Some(json!({"n": 1})));
        assert!(!output.is_error);

        let mut structured = CallToolResult::success(vec![]);
        structured.structured_content = Some(json!({"n": 2}));
        let structured_only = to_output("s", structured);
        assert_eq!(structured_only.data, Some(json!({"n": 2})));
        assert!(structured_only.blocks.iter().any(|b| b.kind
            == BlockKind::Json {
                data: json!({"n": 2})
            }));

        let blobs = to_output(
            "s",
            CallToolResult::success(vec![
                ContentBlock::audio("UklG", "audio/wav"),
                ContentBlock::resource(ResourceContents::BlobResourceContents {
                    uri: "file:///exports/devis.pdf?v=2".into(),
                    mime_type: Some("application/pdf".into()),
                    blob: "JVBE".into(),
                    meta: None,
                }),
            ]),
        );
        assert_eq!(
            blobs
                .blocks
                .iter()
                .map(|b| b.kind.clone())
                .collect::<Vec<_>>(),
            [
                BlockKind::InlineData {
                    media_type: "audio/wav".into(),
                    data: "UklG".into(),
                    name: None
                },
                BlockKind::InlineData {
                    media_type: "application/pdf".into(),
                    data: "JVBE".into(),
                    name: Some("devis.pdf".into())
                },
            ]
        );
        assert_eq!(resource_name("urn:x"), "urn:x");

        let error = to_output("s", CallToolResult::error(vec![ContentBlock::text("bad")]));
        assert!(error.is_error);
        assert_eq!(error.visible_text(), "bad");
    }
}
