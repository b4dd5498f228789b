//! Large results moved out of the context, and `artifact_read` to page through them.
//!
//! A result whose visible text is longer than `offload_over` characters (the tool's
//! declaration, else `execution.tools.offload_over`) is stored whole in the artifact store;
//! `artifact.stored` is journaled before the `tool.completed` that carries only a preview and
//! a note telling the model how to read the rest. From then on, the run offers the built-in
//! `artifact_read` tool, limited to the results offloaded in that run.

use std::sync::Arc;

use loom_core::{
    event::ArtifactStored,
    ports::ArtifactStore,
    tool::{FnTool, ToolDeclarations, ToolError, ToolKind, ToolOutput, ToolSpec},
};
use serde_json::{Value, json};

use crate::binding::BoundTool;

/// Characters of a result shown to the model when the rest is offloaded.
pub(crate) const PREVIEW_CHARS: usize = 2_000;

/// Default page size of `artifact_read`, in characters.
const DEFAULT_LIMIT: u64 = 20_000;

/// Largest page `artifact_read` returns, in characters.
const MAX_LIMIT: u64 = 50_000;

/// The name of the built-in reader.
pub(crate) const ARTIFACT_READ: &str = "artifact_read";

/// Stores `output` whole and returns the `artifact.stored` payload and the preview that
/// replaces it, when it is longer than `limit` characters.
pub(crate) async fn offload(
    store: &dyn ArtifactStore,
    tenant_id: &str,
    session_id: &str,
    tool_name: &str,
    call_id: &str,
    output: &ToolOutput,
    limit: u64,
) -> Result<Option<(ArtifactStored, ToolOutput)>, loom_core::ports::StoreError> {
    let text = output.visible_text();
    let chars = text.chars().count();
    if output.is_error || chars as u64 <= limit {
        return Ok(None);
    }
    let (bytes, media_type, extension, kind) = match &output.data {
        Some(data) => (
            serde_json::to_vec_pretty(data).unwrap_or_default(),
            "application/json",
            "json",
            "JSON",
        ),
        None => (text.clone().into_bytes(), "text/plain", "txt", "text"),
    };
    let size = bytes.len() as u64;
    let uri = store.put(tenant_id, session_id, bytes, extension).await?;
    let preview: String = text.chars().take(PREVIEW_CHARS).collect();
    let note = format!(
        "[Result offloaded: {chars} characters ({kind}); only the preview above is shown. \
         To read the rest: tool {ARTIFACT_READ} with ref=\"{uri}\", offset and limit in characters.]"
    );
    // The full view (for interfaces) stays with the preview; the artifact holds what the
    // model may read.
    let replacement = ToolOutput {
        offloaded: Some(uri.clone()),
        full: output.full.clone(),
        ..ToolOutput::text(format!("{preview}\n{note}"))
    };
    let stored = ArtifactStored {
        uri,
        media_type: media_type.into(),
        size,
        name: Some(format!("{tool_name}.{extension}")),
        origin: "offload".into(),
        call_id: Some(call_id.to_owned()),
    };
    Ok(Some((stored, replacement)))
}

/// The `artifact_read` tool, limited to `allowed` URIs (the results offloaded in the run).
/// The engine offers it by itself once a result was offloaded; it is public for tests.
pub fn artifact_read(store: Arc<dyn ArtifactStore>, allowed: Vec<String>) -> Option<BoundTool> {
    let description = "Reads part of a result that was too long to be shown whole: give its \
                       artifact:// reference, the offset to start from and how many characters to read.";
    let spec = ToolSpec {
        name: ARTIFACT_READ.into(),
        description: description.into(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "ref": {"type": "string", "description": "The artifact:// reference given in the result."},
                "offset": {"type": "integer", "minimum": 0, "default": 0},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT}
            },
            "required": ["ref"],
            "additionalProperties": false
        }),
        kind: ToolKind::Builtin,
        declarations: ToolDeclarations::default(),
    };
    let allowed = Arc::new(allowed);
    let tool = FnTool::new(spec, move |_, args| {
        let store = store.clone();
        let allowed = allowed.clone();
        Box::pin(async move { read(store.as_ref(), &allowed, &args).await })
    });
    match BoundTool::new(
        Arc::new(tool),
        ToolDeclarations::default(),
        description.into(),
    ) {
        Ok(bound) => Some(bound),
        Err(error) => {
            tracing::error!(%error, "artifact_read cannot be offered");
            None
        }
    }
}

async fn read(
    store: &dyn ArtifactStore,
    allowed: &[String],
    args: &Value,
) -> Result<ToolOutput, ToolError> {
    let reference = args.get("ref").and_then(Value::as_str).unwrap_or_default();
    let offset = args.get("offset").and_then(Value::as_u64).unwrap_or(0);
    let limit = args
        .get("limit")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_LIMIT)
        .clamp(1, MAX_LIMIT);
    if !allowed.iter().any(|uri| uri == reference) {
        return Err(ToolError::new(format!(
            "Unknown reference: '{reference}'. Results offloaded in this run: {}.",
            allowed.join(", ")
        )));
    }
    let bytes = store
        .get(reference)
        .await
        .map_err(|e| ToolError::new(format!("the offloaded result cannot be read: {e}")))?
        .ok_or_else(|| {
            ToolError::new(format!(
                "the offloaded result '{reference}' is missing from the artifact store"
            ))
        })?;
    let text = String::from_utf8_lossy(&bytes);
    let total = text.chars().count() as u64;
    let start = offset.min(total);
    let end = (start + limit).min(total);
    let chunk: String = text
        .chars()
        .skip(start as usize)
        .take((end - start) as usize)
        .collect();
    let next = if end < total {
        format!("; next: offset={end}")
    } else {
        "; end of the result".to_owned()
    };
    Ok(ToolOutput::text(format!(
        "[Characters {start} to {end} of {total}{next}]\n{chunk}"
    )))
}
