//! What a caller may send, checked before anything is journaled: every value an access path
//! (library, CLI, REST, MCP, webhook) passes to a run, a decision or a steering message is
//! bounded in depth and size ([`loom_core::limits`]), so that nothing written can be unreadable.
//! A value over a bound is refused with [`LoomError::Invalid`] naming the field and the limit
//! (422 over REST, exit code 2 in the CLI), and nothing is written.

use loom_core::limits::{
    self, LimitError, MAX_ARGUMENTS_BYTES, MAX_LABEL_BYTES, MAX_MESSAGE_BYTES, MAX_METADATA_BYTES,
    MAX_NOTE_BYTES,
};
use serde_json::Value;

use crate::{LoomError, RunOptions};

fn refused(error: LimitError) -> LoomError {
    LoomError::Invalid(error.to_string())
}

/// A run's message and options: `message`, `metadata`, `user_id`, each attachment's name.
pub(crate) fn check_run(message: &str, options: &RunOptions) -> Result<(), LoomError> {
    limits::check_text("message", message, MAX_MESSAGE_BYTES).map_err(refused)?;
    limits::check_object("metadata", &options.metadata, MAX_METADATA_BYTES).map_err(refused)?;
    limits::check_object("state", &options.state, MAX_METADATA_BYTES).map_err(refused)?;
    if let Some(user) = &options.user_id {
        limits::check_text("user_id", user, MAX_LABEL_BYTES).map_err(refused)?;
    }
    for (i, attachment) in options.attachments.iter().enumerate() {
        limits::check_text(
            &format!("attachments[{i}].name"),
            &attachment.name,
            MAX_LABEL_BYTES,
        )
        .map_err(refused)?;
    }
    Ok(())
}

/// A decision on approvals: who decides, why, and the corrected arguments.
pub(crate) fn check_decision(
    by: &str,
    reason: Option<&str>,
    arguments: Option<&Value>,
) -> Result<(), LoomError> {
    limits::check_text("by", by, MAX_LABEL_BYTES).map_err(refused)?;
    if let Some(reason) = reason {
        limits::check_text("reason", reason, MAX_NOTE_BYTES).map_err(refused)?;
    }
    if let Some(arguments) = arguments {
        limits::check_value("arguments", arguments, MAX_ARGUMENTS_BYTES).map_err(refused)?;
    }
    Ok(())
}

/// A steering message.
pub(crate) fn check_steer(message: &str) -> Result<(), LoomError> {
    limits::check_text("message", message, MAX_MESSAGE_BYTES).map_err(refused)
}

/// Who cancels.
pub(crate) fn check_by(by: Option<&str>) -> Result<(), LoomError> {
    match by {
        Some(by) => limits::check_text("by", by, MAX_LABEL_BYTES).map_err(refused),
        None => Ok(()),
    }
}
