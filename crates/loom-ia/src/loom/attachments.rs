//! Files a run carries: attachments read or received within `execution.attachments` limits,
//! and the artifacts a run stored.

use super::Loom;
use crate::LoomError;
use loom_engine::{Attachment, AttachmentLimits};
use std::path::Path;

impl Loom {
    /// Reads the file at `path` as an attachment for [`RunOptions::attachments`]: named after
    /// the file, its media type read from its first bytes, else from its extension. Refused
    /// ([`LoomError::Invalid`], nothing read beyond the limit) when the file cannot be read, is
    /// larger than `execution.attachments.max_bytes`, or is of a type that is not recognised or
    /// not in `execution.attachments.types`; each refusal names the file and the limit.
    ///
    /// [`RunOptions::attachments`]: super::RunOptions::attachments
    pub fn read_attachment(&self, path: &Path) -> Result<Attachment, LoomError> {
        use std::io::Read;
        let shown = path.display();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| shown.to_string());
        let unreadable = |e: std::io::Error| {
            LoomError::Invalid(format!("attachment '{shown}' cannot be read: {e}"))
        };
        let limits = self.attachment_limits();
        let file = std::fs::File::open(path).map_err(unreadable)?;
        let size = file.metadata().map_err(unreadable)?.len();
        if size > limits.max_bytes {
            return Err(LoomError::Invalid(too_large(&name, size, limits.max_bytes)));
        }
        let mut bytes = Vec::new();
        file.take(limits.max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(unreadable)?;
        self.attachment(name, bytes, None)
    }

    /// An attachment for [`RunOptions::attachments`] from bytes received elsewhere (an upload):
    /// its media type is read from its first bytes, else from the name's extension, else taken
    /// from `declared` (what the sender said, `application/octet-stream` ignored). Checked like
    /// [`Loom::read_attachment`] (size, accepted types, an image's bytes matching its type),
    /// with the same refusals ([`LoomError::Invalid`]) naming the file and the limit.
    ///
    /// [`RunOptions::attachments`]: super::RunOptions::attachments
    pub fn attachment(
        &self,
        name: impl Into<String>,
        bytes: Vec<u8>,
        declared: Option<&str>,
    ) -> Result<Attachment, LoomError> {
        let name = name.into();
        let limits = self.attachment_limits();
        let size = bytes.len() as u64;
        if size > limits.max_bytes {
            return Err(LoomError::Invalid(too_large(&name, size, limits.max_bytes)));
        }
        let declared = declared
            .map(|t| {
                t.split(';')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_ascii_lowercase()
            })
            .filter(|t| !t.is_empty() && t != "application/octet-stream");
        let detected = loom_engine::attachments::sniff_media_type(&bytes)
            .or_else(|| loom_engine::attachments::media_type_of_name(&name))
            .map(str::to_owned);
        let Some(media_type) = detected.or(declared) else {
            return Err(LoomError::Invalid(format!(
                "attachment '{name}': unsupported type (recognised neither from its content nor \
                 from its extension; execution.attachments.types: {})",
                limits.types.join(", ")
            )));
        };
        let attachment = Attachment {
            name,
            media_type,
            bytes,
        };
        limits
            .check(std::slice::from_ref(&attachment))
            .map_err(LoomError::Invalid)?;
        Ok(attachment)
    }

    /// The limits attachments are checked against (`execution.attachments`).
    pub fn attachment_limits(&self) -> &AttachmentLimits {
        self.inner.engine.attachment_limits()
    }

    /// The bytes of the artifact `uri` (`artifact://<tenant>/<session>/<file>`) of `tenant`:
    /// `None` when the URI names another tenant, is not an artifact URI, or nothing is stored
    /// under it.
    pub async fn artifact(&self, tenant: &str, uri: &str) -> Result<Option<Vec<u8>>, LoomError> {
        let mine = uri
            .strip_prefix("artifact://")
            .and_then(|rest| rest.strip_prefix(tenant))
            .is_some_and(|rest| rest.starts_with('/'));
        if !mine {
            return Ok(None);
        }
        match self.inner.engine.artifacts() {
            Some(artifacts) => Ok(artifacts.get(uri).await?),
            None => Ok(None),
        }
    }
}

/// Why an attachment of `size` bytes is refused.
fn too_large(name: &str, size: u64, max_bytes: u64) -> String {
    format!(
        "attachment '{name}' is {size} bytes, more than the limit of {max_bytes} bytes \
         (execution.attachments.max_bytes)"
    )
}
