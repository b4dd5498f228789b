//! Files a tool returns: an image, a document. The journal never holds their bytes.
//!
//! A tool's result may carry files as `inline_data` blocks (base64 with a media type): an MCP
//! server's image, audio or embedded binary resource, or a Rust tool returning an [`Image`] or
//! a [`ToolFile`]. Before the result goes anywhere (its business-key record, the `after_tool`
//! point, `tool.completed`), each such block is stored in the artifact store
//! (content-addressed: `artifact://<tenant>/<session>/<sha256>.<ext>`), one `artifact.stored`
//! (origin `tool_output`, with the call id) is journaled before the call's `tool.completed`,
//! and the block is replaced by an `artifact` block naming the file by URI; the URI is also
//! listed in the result's `artifacts`. Without an artifact store (`storage.artifacts: null`),
//! the block is replaced by a note saying the file was not kept.

use std::{fmt, sync::Arc};

use base64::Engine as _;
use loom_core::{
    Block, BlockKind,
    event::ArtifactStored,
    ports::{ArtifactStore, StoreError},
    tool::{IntoToolOutput, ToolOutput},
};

use crate::attachments::{extension, media_type_of_name, sniff_media_type};

/// The `artifact.stored` origin of a file a tool returned.
pub const TOOL_OUTPUT_ORIGIN: &str = "tool_output";

/// An image a tool returns (`#[tool] fn chart(..) -> Image`): stored as an artifact, shown to
/// the model and to callers by its `artifact://` URI.
///
/// ```
/// use loom_engine::Image;
///
/// let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
/// let image = Image::detect(png).expect("a PNG").named("chart.png");
/// assert_eq!(image.media_type, "image/png");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Image {
    /// Its media type (`image/png`…).
    pub media_type: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// A display name, journaled with the artifact.
    pub name: Option<String>,
}

impl Image {
    /// An image of `media_type`.
    pub fn new(media_type: impl Into<String>, bytes: Vec<u8>) -> Image {
        Image {
            media_type: media_type.into(),
            bytes,
            name: None,
        }
    }

    /// A PNG image.
    pub fn png(bytes: Vec<u8>) -> Image {
        Image::new("image/png", bytes)
    }

    /// A JPEG image.
    pub fn jpeg(bytes: Vec<u8>) -> Image {
        Image::new("image/jpeg", bytes)
    }

    /// An image whose type its bytes tell (PNG, JPEG, GIF, WebP); `None` for other bytes.
    pub fn detect(bytes: Vec<u8>) -> Option<Image> {
        let media_type = sniff_media_type(&bytes)?;
        Some(Image::new(media_type, bytes))
    }

    /// Gives the image a display name (builder style).
    pub fn named(mut self, name: impl Into<String>) -> Image {
        self.name = Some(name.into());
        self
    }

    /// The block that carries the image in a [`ToolOutput`], to put beside other blocks
    /// (`output.blocks.push(image.block())`).
    pub fn block(&self) -> Block {
        inline_block(&self.media_type, &self.bytes, self.name.clone())
    }
}

impl fmt::Debug for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Image")
            .field("media_type", &self.media_type)
            .field("size", &self.bytes.len())
            .field("name", &self.name)
            .finish()
    }
}

impl IntoToolOutput for Image {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput {
            blocks: vec![self.block()],
            ..ToolOutput::default()
        }
    }
}

/// A file a tool returns (`#[tool] fn export(..) -> ToolFile`): a PDF, a CSV, a spreadsheet.
/// Stored as an artifact under its name, shown to the model and to callers by its
/// `artifact://` URI.
#[derive(Clone, PartialEq, Eq)]
pub struct ToolFile {
    /// Its display name (`devis-D-1.pdf`), journaled with the artifact.
    pub name: String,
    /// Its media type.
    pub media_type: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

impl ToolFile {
    /// A file named `name` of `media_type`.
    pub fn new(name: impl Into<String>, media_type: impl Into<String>, bytes: Vec<u8>) -> ToolFile {
        ToolFile {
            name: name.into(),
            media_type: media_type.into(),
            bytes,
        }
    }

    /// A file whose media type is read from its bytes (images), else from the name's extension
    /// (images, PDF, text, Markdown, CSV, JSON), else `application/octet-stream`.
    pub fn detect(name: impl Into<String>, bytes: Vec<u8>) -> ToolFile {
        let name = name.into();
        let media_type = sniff_media_type(&bytes)
            .or_else(|| media_type_of_name(&name))
            .unwrap_or("application/octet-stream");
        ToolFile::new(name, media_type, bytes)
    }

    /// The block that carries the file in a [`ToolOutput`], to put beside other blocks.
    pub fn block(&self) -> Block {
        inline_block(&self.media_type, &self.bytes, Some(self.name.clone()))
    }
}

impl fmt::Debug for ToolFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolFile")
            .field("name", &self.name)
            .field("media_type", &self.media_type)
            .field("size", &self.bytes.len())
            .finish()
    }
}

impl IntoToolOutput for ToolFile {
    fn into_tool_output(self) -> ToolOutput {
        ToolOutput {
            blocks: vec![self.block()],
            ..ToolOutput::default()
        }
    }
}

fn inline_block(media_type: &str, bytes: &[u8], name: Option<String>) -> Block {
    Block::new(BlockKind::InlineData {
        media_type: media_type.to_owned(),
        data: base64::engine::general_purpose::STANDARD.encode(bytes),
        name,
    })
}

/// Where the files of a call's result go.
pub(crate) struct Destination<'a> {
    /// The artifact store (`None`: files are not kept).
    pub(crate) store: Option<&'a Arc<dyn ArtifactStore>>,
    /// The run's tenant.
    pub(crate) tenant_id: &'a str,
    /// The run's session.
    pub(crate) session_id: &'a str,
    /// The call whose result it is.
    pub(crate) call_id: &'a str,
}

/// Stores the files (`inline_data` blocks) of `output` and returns the `artifact.stored` of
/// each, in block order, and the output with `artifact` blocks in their place (see the module
/// documentation). An output without files comes back as it was.
pub(crate) async fn store_files(
    to: &Destination<'_>,
    mut output: ToolOutput,
) -> Result<(Vec<ArtifactStored>, ToolOutput), StoreError> {
    let mut stored = Vec::new();
    for block in &mut output.blocks {
        let BlockKind::InlineData {
            media_type,
            data,
            name,
        } = &block.kind
        else {
            continue;
        };
        let bytes = match base64::engine::general_purpose::STANDARD.decode(data.as_bytes()) {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::warn!(call_id = to.call_id, %media_type, %error, "a file of a tool result is not valid base64: dropped");
                *block = Block::text(format!(
                    "[A file ({media_type}) of this result was dropped: its bytes were not valid base64.]"
                ));
                continue;
            }
        };
        let size = bytes.len() as u64;
        let Some(store) = to.store else {
            *block = Block::text(format!(
                "[A file ({media_type}, {size} bytes) of this result was not kept: no artifact store is configured.]"
            ));
            continue;
        };
        let uri = store
            .put(to.tenant_id, to.session_id, bytes, extension(media_type))
            .await?;
        let (media_type, name) = (media_type.clone(), name.clone());
        *block = Block::new(BlockKind::Artifact {
            uri: uri.clone(),
            media_type: media_type.clone(),
            size,
            name: name.clone(),
        });
        if !output.artifacts.contains(&uri) {
            output.artifacts.push(uri.clone());
        }
        stored.push(ArtifactStored {
            uri,
            media_type,
            size,
            name,
            origin: TOOL_OUTPUT_ORIGIN.into(),
            call_id: Some(to.call_id.to_owned()),
        });
    }
    Ok((stored, output))
}

#[cfg(test)]
mod tests {
    use loom_core::BoxFuture;
    use std::sync::Mutex;

    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    /// An artifact store that keeps what it is given.
    #[derive(Debug, Default)]
    struct Kept(Mutex<Vec<(String, Vec<u8>)>>);

    impl ArtifactStore for Kept {
        fn put<'a>(
            &'a self,
            tenant_id: &'a str,
            session_id: &'a str,
            bytes: Vec<u8>,
            extension: &'a str,
        ) -> BoxFuture<'a, Result<String, StoreError>> {
            Box::pin(async move {
                let mut kept = self.0.lock().unwrap();
                let uri = format!(
                    "artifact://{tenant_id}/{session_id}/{}.{extension}",
                    kept.len()
                );
                kept.push((uri.clone(), bytes));
                Ok(uri)
            })
        }

        fn get<'a>(&'a self, uri: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
            Box::pin(async move {
                let kept = self.0.lock().unwrap();
                Ok(kept.iter().find(|(u, _)| u == uri).map(|(_, b)| b.clone()))
            })
        }

        fn delete_session<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<u64, StoreError>> {
            Box::pin(async { Ok(0) })
        }
    }

    fn destination<'a>(store: Option<&'a Arc<dyn ArtifactStore>>) -> Destination<'a> {
        Destination {
            store,
            tenant_id: "t",
            session_id: "s",
            call_id: "c1",
        }
    }

    #[tokio::test]
    async fn files_become_artifacts_in_block_order() {
        let kept = Arc::new(Kept::default());
        let store: Arc<dyn ArtifactStore> = kept.clone();
        let mut output = ToolOutput::text("chart and data");
        output
            .blocks
            .push(Image::png(PNG.to_vec()).named("chart.png").block());
        output
            .blocks
            .push(ToolFile::detect("lines.csv", b"a;b\n1;2\n".to_vec()).block());
        let (stored, output) = store_files(&destination(Some(&store)), output)
            .await
            .unwrap();
        assert_eq!(stored.len(), 2);
        assert_eq!(stored[0].uri, "artifact://t/s/0.png");
        assert_eq!(stored[0].media_type, "image/png");
        assert_eq!(stored[0].size, PNG.len() as u64);
        assert_eq!(stored[0].name.as_deref(), Some("chart.png"));
        assert_eq!(stored[0].origin, "tool_output");
        assert_eq!(stored[0].call_id.as_deref(), Some("c1"));
        assert_eq!(stored[1].uri, "artifact://t/s/1.csv");
        assert_eq!(stored[1].media_type, "text/csv");
        assert_eq!(kept.0.lock().unwrap()[0].1, PNG);
        assert_eq!(
            output.artifacts,
            ["artifact://t/s/0.png", "artifact://t/s/1.csv"]
        );
        assert_eq!(
            output.blocks[1].kind,
            BlockKind::Artifact {
                uri: "artifact://t/s/0.png".into(),
                media_type: "image/png".into(),
                size: PNG.len() as u64,
                name: Some("chart.png".into()),
            }
        );
        assert!(
            !output
                .blocks
                .iter()
                .any(|b| matches!(b.kind, BlockKind::InlineData { .. }))
        );
        assert_eq!(
            output.visible_text(),
            "chart and data\nartifact://t/s/0.png\nartifact://t/s/1.csv"
        );
    }

    #[tokio::test]
    async fn without_a_store_or_with_bad_bytes_a_note_stands_for_the_file() {
        let output = Image::png(PNG.to_vec()).into_tool_output();
        let (stored, output) = store_files(&destination(None), output).await.unwrap();
        assert!(stored.is_empty());
        assert!(output.visible_text().contains("was not kept"), "{output:?}");

        let bad = ToolOutput {
            blocks: vec![Block::new(BlockKind::InlineData {
                media_type: "image/png".into(),
                data: "not base64!".into(),
                name: None,
            })],
            ..ToolOutput::default()
        };
        let store: Arc<dyn ArtifactStore> = Arc::new(Kept::default());
        let (stored, output) = store_files(&destination(Some(&store)), bad).await.unwrap();
        assert!(stored.is_empty());
        assert!(output.visible_text().contains("not valid base64"));
    }

    #[test]
    fn files_read_their_type_and_hide_their_bytes() {
        assert_eq!(Image::detect(PNG.to_vec()).unwrap().media_type, "image/png");
        assert!(Image::detect(b"plain".to_vec()).is_none());
        assert_eq!(
            ToolFile::detect("devis.pdf", b"%PDF-1.7".to_vec()).media_type,
            "application/pdf"
        );
        assert_eq!(
            ToolFile::detect("blob", vec![0, 1]).media_type,
            "application/octet-stream"
        );
        assert_eq!(
            format!("{:?}", Image::png(PNG.to_vec())),
            "Image { media_type: \"image/png\", size: 16, name: None }"
        );
        assert_eq!(
            format!("{:?}", ToolFile::new("a.csv", "text/csv", vec![1, 2])),
            "ToolFile { name: \"a.csv\", media_type: \"text/csv\", size: 2 }"
        );
    }
}
