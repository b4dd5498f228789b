//! Files attached to a run's request, and images sent inline to the models that can see them.
//!
//! **Opening.** [`crate::Engine::begin`] checks the attachments against the engine's
//! [`AttachmentLimits`] (count, size, accepted types, bytes that match the declared image type)
//! before anything is written, stores each one in the artifact store (content-addressed:
//! `artifact://<tenant>/<session>/<sha256>.<ext>`), and writes one `artifact.stored` (origin
//! `attachment`) per file between `run.started` and `message.user`, whose message is the user's
//! text followed by one `artifact` block per file. The journal never holds the bytes.
//!
//! **Requests.** A request keeps its `artifact` blocks; when it goes to a model that reads images
//! ([`crate::ModelBinding::vision`]), the image blocks of its user messages are replaced by
//! `inline_data` (base64 read from the artifact store) just before the call, after the request
//! hash is computed: the hash names the request as the journal knows it (content-addressed
//! references), so it is the same whether the bytes were inlined or not. A model without vision
//! receives the references, which providers render as a note naming the file.

use std::{fmt, sync::Arc};

use base64::Engine as _;
use loom_core::{
    Block, BlockKind, Role,
    event::ArtifactStored,
    model::ModelRequest,
    ports::{ArtifactStore, StoreError},
};

/// A file attached to a run's request.
#[derive(Clone, PartialEq, Eq)]
pub struct Attachment {
    /// Display name (usually the file name), journaled.
    pub name: String,
    /// Media type, one of [`AttachmentLimits::types`].
    pub media_type: String,
    /// The file's bytes (stored in the artifact store, never in the journal).
    pub bytes: Vec<u8>,
}

impl fmt::Debug for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attachment")
            .field("name", &self.name)
            .field("media_type", &self.media_type)
            .field("size", &self.bytes.len())
            .finish()
    }
}

impl Attachment {
    /// An attachment named `name`, whose media type is read from its bytes (see
    /// [`sniff_media_type`]), else from the name's extension (see [`media_type_of_name`]);
    /// `None` when neither tells.
    pub fn detect(name: impl Into<String>, bytes: Vec<u8>) -> Option<Attachment> {
        let name = name.into();
        let media_type = sniff_media_type(&bytes).or_else(|| media_type_of_name(&name))?;
        Some(Attachment {
            name,
            media_type: media_type.to_owned(),
            bytes,
        })
    }
}

/// The image types every vision model reads, accepted by default.
pub const IMAGE_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

/// Limits on the files of one request (`execution.attachments`), checked before anything is
/// written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentLimits {
    /// Largest file, in bytes.
    pub max_bytes: u64,
    /// Accepted media types.
    pub types: Vec<String>,
    /// Most files on one request.
    pub max_files: usize,
}

impl Default for AttachmentLimits {
    /// 5 MiB per file, [`IMAGE_TYPES`], 10 files (the reference's defaults).
    fn default() -> Self {
        AttachmentLimits {
            max_bytes: 5_242_880,
            types: IMAGE_TYPES.map(str::to_owned).to_vec(),
            max_files: 10,
        }
    }
}

impl AttachmentLimits {
    /// Checks `attachments`: their count, then each file's name, size, type, and that the bytes
    /// of an image are of the declared type. The refusal names the file and the limit.
    pub fn check(&self, attachments: &[Attachment]) -> Result<(), String> {
        if attachments.len() > self.max_files {
            return Err(format!(
                "{} attachments, more than the limit of {} (execution.attachments.max_files)",
                attachments.len(),
                self.max_files
            ));
        }
        for attachment in attachments {
            let name = &attachment.name;
            if name.trim().is_empty() || name.chars().any(char::is_control) {
                return Err(format!(
                    "attachment {name:?}: a name is required, without control characters"
                ));
            }
            let size = attachment.bytes.len() as u64;
            if size == 0 {
                return Err(format!("attachment '{name}' is empty"));
            }
            if size > self.max_bytes {
                return Err(format!(
                    "attachment '{name}' is {size} bytes, more than the limit of {} bytes \
                     (execution.attachments.max_bytes)",
                    self.max_bytes
                ));
            }
            if !self.types.contains(&attachment.media_type) {
                return Err(format!(
                    "attachment '{name}': type {} is not accepted (execution.attachments.types: {})",
                    attachment.media_type,
                    self.types.join(", ")
                ));
            }
            let sniffed = sniff_media_type(&attachment.bytes);
            let known = IMAGE_TYPES.contains(&attachment.media_type.as_str());
            if (known || sniffed.is_some()) && sniffed != Some(attachment.media_type.as_str()) {
                return Err(format!(
                    "attachment '{name}' is declared {} but its content is {}",
                    attachment.media_type,
                    sniffed.unwrap_or("not an image of that type")
                ));
            }
        }
        Ok(())
    }
}

/// The image type its first bytes (magic numbers) say: PNG, JPEG, GIF or WebP.
pub fn sniff_media_type(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// The media type a file name's extension says (case-insensitive), for the types a run may
/// carry: images, PDF, plain text, Markdown, CSV, JSON.
pub fn media_type_of_name(name: &str) -> Option<&'static str> {
    let (_, extension) = name.rsplit_once('.')?;
    Some(match extension.to_ascii_lowercase().as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "txt" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "json" => "application/json",
        _ => return None,
    })
}

/// The extension an artifact of `media_type` is stored under.
pub(crate) fn extension(media_type: &str) -> &str {
    match media_type {
        "image/jpeg" => "jpg",
        "image/png" => "png",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "application/pdf" => "pdf",
        "text/plain" => "txt",
        "text/markdown" => "md",
        "text/csv" => "csv",
        "application/json" => "json",
        "audio/mpeg" => "mp3",
        "audio/wav" | "audio/x-wav" => "wav",
        "audio/ogg" => "ogg",
        _ => "bin",
    }
}

/// Stores each attachment and returns its `artifact.stored` payload and the `artifact` block
/// that stands for it in `message.user`.
pub(crate) async fn store(
    store: &dyn ArtifactStore,
    tenant_id: &str,
    session_id: &str,
    attachments: &[Attachment],
) -> Result<Vec<(ArtifactStored, Block)>, StoreError> {
    let mut stored = Vec::with_capacity(attachments.len());
    for attachment in attachments {
        let size = attachment.bytes.len() as u64;
        let uri = store
            .put(
                tenant_id,
                session_id,
                attachment.bytes.clone(),
                extension(&attachment.media_type),
            )
            .await?;
        let block = Block::new(BlockKind::Artifact {
            uri: uri.clone(),
            media_type: attachment.media_type.clone(),
            size,
            name: Some(attachment.name.clone()),
        });
        let event = ArtifactStored {
            uri,
            media_type: attachment.media_type.clone(),
            size,
            name: Some(attachment.name.clone()),
            origin: "attachment".into(),
            call_id: None,
        };
        stored.push((event, block));
    }
    Ok(stored)
}

/// The request with the image `artifact` blocks of its user messages replaced by `inline_data`
/// read from `store`. An image that cannot be read stays a reference (with a warning): the
/// model is then told a file was there instead of seeing it.
pub(crate) async fn inline_images(
    store: Option<&Arc<dyn ArtifactStore>>,
    mut request: ModelRequest,
) -> ModelRequest {
    let is_image = |block: &loom_core::Block| matches!(&block.kind, BlockKind::Artifact { media_type, .. } if media_type.starts_with("image/"));
    // Only a message holding an image is copied out of the shared history.
    let with_image = |message: &&mut Arc<loom_core::Message>| {
        message.role == Role::User && message.blocks.iter().any(is_image)
    };
    for shared in request.messages.iter_mut().filter(with_image) {
        let message = Arc::make_mut(shared);
        for block in message.blocks.iter_mut().filter(|block| is_image(block)) {
            let BlockKind::Artifact {
                uri,
                media_type,
                name,
                ..
            } = &block.kind
            else {
                continue;
            };
            let read = match store {
                Some(store) => store.get(uri).await,
                None => Ok(None),
            };
            match read {
                Ok(Some(bytes)) => {
                    block.kind = BlockKind::InlineData {
                        media_type: media_type.clone(),
                        data: base64::engine::general_purpose::STANDARD.encode(bytes),
                        name: name.clone(),
                    };
                }
                Ok(None) => {
                    tracing::warn!(%uri, "image missing from the artifact store: sent as a reference");
                }
                Err(error) => {
                    tracing::warn!(%uri, %error, "image unreadable: sent as a reference");
                }
            }
        }
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    fn png(name: &str) -> Attachment {
        Attachment {
            name: name.into(),
            media_type: "image/png".into(),
            bytes: PNG.to_vec(),
        }
    }

    #[test]
    fn types_are_read_from_bytes_then_names() {
        assert_eq!(sniff_media_type(PNG), Some("image/png"));
        assert_eq!(sniff_media_type(b"\xff\xd8\xff\xe0"), Some("image/jpeg"));
        assert_eq!(sniff_media_type(b"GIF89a.."), Some("image/gif"));
        assert_eq!(
            sniff_media_type(b"RIFF\0\0\0\0WEBPVP8 "),
            Some("image/webp")
        );
        assert_eq!(sniff_media_type(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(media_type_of_name("Photo.JPG"), Some("image/jpeg"));
        assert_eq!(media_type_of_name("notes"), None);
        // The bytes win over a misleading extension.
        let detected = Attachment::detect("car.jpg", PNG.to_vec()).unwrap();
        assert_eq!(detected.media_type, "image/png");
        assert_eq!(
            Attachment::detect("doc.pdf", b"%PDF-1.7".to_vec())
                .unwrap()
                .media_type,
            "application/pdf"
        );
        assert!(Attachment::detect("blob", vec![1, 2, 3]).is_none());
    }

    #[test]
    fn limits_name_the_file_and_the_limit() {
        let limits = AttachmentLimits {
            max_bytes: 20,
            max_files: 2,
            ..AttachmentLimits::default()
        };
        assert_eq!(limits.check(&[png("a.png")]), Ok(()));
        assert_eq!(
            limits.check(&[png("a.png"), png("b.png"), png("c.png")]),
            Err("3 attachments, more than the limit of 2 (execution.attachments.max_files)".into())
        );
        let mut big = png("big.png");
        big.bytes.extend([0; 10]);
        assert_eq!(
            limits.check(&[big]),
            Err(
                "attachment 'big.png' is 26 bytes, more than the limit of 20 bytes \
                 (execution.attachments.max_bytes)"
                    .into()
            )
        );
        let pdf = Attachment {
            name: "doc.pdf".into(),
            media_type: "application/pdf".into(),
            bytes: b"%PDF".to_vec(),
        };
        assert_eq!(
            limits.check(&[pdf]),
            Err(
                "attachment 'doc.pdf': type application/pdf is not accepted \
                 (execution.attachments.types: image/jpeg, image/png, image/gif, image/webp)"
                    .into()
            )
        );
        let fake = Attachment {
            bytes: b"not a png".to_vec(),
            ..png("fake.png")
        };
        assert_eq!(
            limits.check(&[fake]),
            Err(
                "attachment 'fake.png' is declared image/png but its content is not an image \
                 of that type"
                    .into()
            )
        );
        let liar = Attachment {
            media_type: "image/gif".into(),
            ..png("liar.gif")
        };
        assert_eq!(
            limits.check(&[liar]),
            Err("attachment 'liar.gif' is declared image/gif but its content is image/png".into())
        );
        assert!(
            limits
                .check(&[png(" ")])
                .unwrap_err()
                .contains("a name is required")
        );
        let empty = Attachment {
            bytes: Vec::new(),
            ..png("empty.png")
        };
        assert_eq!(
            limits.check(&[empty]),
            Err("attachment 'empty.png' is empty".into())
        );
    }

    #[test]
    fn debug_leaves_the_bytes_out() {
        assert_eq!(
            format!("{:?}", png("a.png")),
            "Attachment { name: \"a.png\", media_type: \"image/png\", size: 16 }"
        );
    }
}
