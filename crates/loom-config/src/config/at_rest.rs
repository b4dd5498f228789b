//! The checks of `storage.encryption` and `storage.retention`.

use crate::error::{ConfigError, ConfigErrorKind};
use crate::model::{EventsBackend, LoomConfig};
use crate::yaml::KeyPath;

use super::Doc;

/// `storage.encryption`: at least one key name, none empty or listed twice, and a durable
/// journal (the memory journal keeps nothing at rest); `storage.retention.events_days` above 0.
pub(super) fn check(doc: &Doc, raw: &LoomConfig) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    let storage = KeyPath::root().key("storage");
    if let Some(encryption) = &raw.storage.encryption {
        let ep = storage.key("encryption");
        if raw.storage.events.backend == EventsBackend::Memory {
            return Err(invalid(
                &ep,
                "encryption needs a durable journal (storage.events.backend jsonl or sqlite): the \
                 memory journal keeps nothing at rest"
                    .into(),
            ));
        }
        if encryption.keys.is_empty() {
            return Err(invalid(
                &ep.key("keys"),
                "at least one key name is needed (the first seals, all open)".into(),
            ));
        }
        for (i, name) in encryption.keys.iter().enumerate() {
            let at = ep.key("keys").index(i);
            if name.trim().is_empty() || name.contains(['=', '\0']) {
                return Err(invalid(
                    &at,
                    format!("'{name}' cannot name a secret (a variable name is expected)"),
                ));
            }
            if encryption.keys[..i].contains(name) {
                return Err(invalid(&at, format!("key '{name}' is listed twice")));
            }
        }
    }
    if raw.storage.retention.events_days == Some(0) {
        return Err(invalid(
            &storage.key("retention").key("events_days"),
            "must be a whole number of days, 1 or more (or null to keep everything)".into(),
        ));
    }
    Ok(())
}
