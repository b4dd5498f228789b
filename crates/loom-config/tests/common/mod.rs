//! Helpers shared by the integration tests.

#![allow(dead_code, unreachable_pub)]

use std::path::Path;

use loom_config::{Config, ConfigError, Profile};
use tempfile::TempDir;

/// A temporary config directory holding `files` (relative path, content).
pub fn dir_with(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (rel, content) in files {
        let path = dir.path().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(&path, content).expect("write");
    }
    dir
}

/// No environment variables.
pub fn no_env(_: &str) -> Option<String> {
    None
}

/// Loads `loom.yaml` text (shown as `loom.yaml`) with `files` around it.
pub fn load_str(
    root: &str,
    files: &[(&str, &str)],
    profile: Option<Profile>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let dir = dir_with(files);
    loom_config::from_yaml_str(root, dir.path(), profile, env)
}

/// The error message for a configuration that must be refused.
pub fn refused(root: &str, files: &[(&str, &str)]) -> String {
    refused_with(root, files, None, &no_env)
}

/// Same, with a profile override and an environment.
pub fn refused_with(
    root: &str,
    files: &[(&str, &str)],
    profile: Option<Profile>,
    env: &dyn Fn(&str) -> Option<String>,
) -> String {
    match load_str(root, files, profile, env) {
        Ok(_) => panic!("configuration accepted, expected a refusal:\n{root}"),
        Err(err) => err.to_string(),
    }
}

/// Keeps the directory alive with the config.
pub fn load_dir(dir: &Path, profile: Option<Profile>) -> Result<Config, ConfigError> {
    loom_config::load(&dir.join("loom.yaml"), profile, &no_env)
}
