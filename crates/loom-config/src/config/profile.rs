//! Profiles: which one is active (`--profile` > `LOOM_PROFILE` > `profile:`), and the deep
//! merge of `profiles.<profile>` over the root document.

use crate::error::{ConfigError, ConfigErrorKind};
use crate::model::Profile;
use crate::yaml::{self, KeyPath, Kind, Node};

use super::{Doc, make_error};

pub(super) fn select_profile(
    doc: &Doc,
    override_profile: Option<Profile>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Profile>, ConfigError> {
    if let Some(profile) = override_profile {
        return Ok(Some(profile));
    }
    let path = KeyPath::root().key("profile");
    if let Some(value) = env("LOOM_PROFILE") {
        let value = value.trim();
        if !value.is_empty() {
            return value.parse().map(Some).map_err(|msg: String| {
                make_error(
                    &doc.display,
                    None,
                    &path,
                    ConfigErrorKind::Reference,
                    format!("{msg}, from LOOM_PROFILE"),
                )
            });
        }
    }
    match doc.tree.get("profile").map(|n| &n.kind) {
        Some(Kind::Str(name)) => name
            .parse()
            .map(Some)
            .map_err(|msg: String| doc.error(&path, ConfigErrorKind::Reference, msg)),
        // Null or absent: no profile; another type is reported by the typed stage.
        _ => Ok(None),
    }
}

/// Deep-merges `profiles.<profile>` over the root and records the active profile.
pub(super) fn apply_profile(doc: &mut Doc, profile: Profile) -> Result<(), ConfigError> {
    let over = doc
        .tree
        .get("profiles")
        .and_then(|p| p.get(profile.as_str()))
        .cloned();
    if let Some(over) = over
        && let Kind::Map(entries) = &over.kind
    {
        for (key, _) in entries {
            if key.name == "profile" || key.name == "profiles" {
                let path = KeyPath::root()
                    .key("profiles")
                    .key(profile.as_str())
                    .key(&key.name);
                return Err(doc.key_error(
                    &path,
                    ConfigErrorKind::Invalid,
                    format!("'{}' cannot be set inside a profile", key.name),
                ));
            }
        }
        yaml::merge(&mut doc.tree, &over);
    }
    if let Kind::Map(entries) = &mut doc.tree.kind {
        let value = Kind::Str(profile.as_str().to_owned());
        match entries.iter_mut().find(|(k, _)| k.name == "profile") {
            Some((_, node)) => node.kind = value,
            None => entries.push((
                yaml::Key {
                    name: "profile".to_owned(),
                    loc: None,
                },
                Node::bare(value),
            )),
        }
    }
    Ok(())
}
