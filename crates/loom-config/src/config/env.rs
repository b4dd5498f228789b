//! Which env file a configuration is loaded with, read before its profile is chosen: see
//! [`crate::EnvFile`].

use std::path::{Path, PathBuf};

use super::{Doc, display_path};
use crate::env_file::{self, EnvFile, EnvVars};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::model::Profile;
use crate::yaml::{KeyPath, Kind};

/// Reads the env file `choice` names (see [`EnvFile`]); `env_file` inside `profiles` is
/// refused, since the file is read before a profile is chosen.
pub(super) fn read_env_file(
    doc: &Doc,
    base: &Path,
    choice: Option<&EnvFile>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<EnvVars, ConfigError> {
    for profile in [Profile::Dev, Profile::Prod] {
        let inside = doc
            .tree
            .get("profiles")
            .and_then(|p| p.get(profile.as_str()))
            .and_then(|p| p.get("env_file"));
        if inside.is_some() {
            let path = KeyPath::root()
                .key("profiles")
                .key(profile.as_str())
                .key("env_file");
            return Err(doc.key_error(
                &path,
                ConfigErrorKind::Invalid,
                "'env_file' cannot be set inside a profile: the env file is read before the \
                 profile is chosen",
            ));
        }
    }
    let declared = match doc.tree.get("env_file").map(|n| &n.kind) {
        Some(Kind::Str(path)) => Some(PathBuf::from(path)),
        // Null or absent: none; another type is reported by the typed stage.
        _ => None,
    };
    match (choice, declared) {
        (Some(EnvFile::Off), _) => Ok(EnvVars::default()),
        (Some(EnvFile::Path(path)), _) => env_file::read(path, path, env),
        (_, Some(declared)) => {
            let full = base.join(&declared);
            if !full.exists() {
                return Err(doc.error(
                    &KeyPath::root().key("env_file"),
                    ConfigErrorKind::MissingFile,
                    format!("env file {} not found", display_path(base, &full).display()),
                ));
            }
            env_file::read(&full, &display_path(base, &full), env)
        }
        (Some(EnvFile::Beside), None) => {
            let beside = base.join(".env");
            if beside.exists() {
                env_file::read(&beside, &display_path(base, &beside), env)
            } else {
                Ok(EnvVars::default())
            }
        }
        (None, None) => Ok(EnvVars::default()),
    }
}
