//! The checks of `sessions.compaction` and `sessions.history`, and the summarizer's system
//! prompt read from `system_file`.

use crate::error::{ConfigError, ConfigErrorKind};
use crate::yaml::KeyPath;

use super::{Config, NOT_POSITIVE, agents::read_system_prompt};

/// The name of the internal agent that writes compaction summaries: no declared agent may
/// take it.
pub const COMPACTION_AGENT: &str = "_compaction";

/// `sessions.compaction`: a declared model, `hard_tokens` above `over_tokens` (both above 0),
/// and a `system_file` that exists under `prompts_dir` (read here); `sessions.history` caps
/// above 0. Returns the summarizer's system prompt from `system_file`, if any.
pub(super) fn check(config: &Config) -> Result<Option<String>, ConfigError> {
    let doc = &config.docs[0];
    let sessions = KeyPath::root().key("sessions");
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    let history = &config.raw.sessions.history;
    if history.max_turns == Some(0) {
        return Err(invalid(
            &sessions.key("history").key("max_turns"),
            NOT_POSITIVE.into(),
        ));
    }
    if history.max_tokens == Some(0) {
        return Err(invalid(
            &sessions.key("history").key("max_tokens"),
            NOT_POSITIVE.into(),
        ));
    }
    let Some(compaction) = &config.raw.sessions.compaction else {
        return Ok(None);
    };
    let at = sessions.key("compaction");
    if config.model(&compaction.model).is_none() {
        let declared: Vec<&str> = config.raw.models.iter().map(|m| m.id.as_str()).collect();
        return Err(doc.error(
            &at.key("model"),
            ConfigErrorKind::Reference,
            format!(
                "unknown compaction model '{}' (declared models: {})",
                compaction.model,
                if declared.is_empty() {
                    "none".to_owned()
                } else {
                    declared.join(", ")
                }
            ),
        ));
    }
    if compaction.over_tokens == 0 {
        return Err(invalid(&at.key("over_tokens"), NOT_POSITIVE.into()));
    }
    if compaction.hard_tokens <= compaction.over_tokens {
        return Err(invalid(
            &at.key("hard_tokens"),
            format!(
                "must be greater than over_tokens ({}): hard_tokens is the safety net past \
                 which a run compacts before it starts",
                compaction.over_tokens
            ),
        ));
    }
    match &compaction.system_file {
        Some(file) => {
            let (text, _) = read_system_prompt(config, doc, &at, "", Some(file))?;
            if text.trim().is_empty() {
                return Err(invalid(
                    &at.key("system_file"),
                    "the summarizer's system prompt file is empty".into(),
                ));
            }
            Ok(Some(text))
        }
        None => Ok(None),
    }
}
