//! The environment as a configuration sees it: the process environment, then the env file read
//! with the configuration (`env_file:`, `.env` beside it, `--env-file`), as the reference loads
//! `.env` without overriding what is already set.
//!
//! Every variable the facade reads for a configuration (`api_key_env`, `env_from`,
//! `headers_env`, `secret_env`) is read here.

use std::env::VarError;

use loom_config::Config;

/// `name` from the process environment, else from the configuration's env file. A variable
/// set in the environment wins even when empty; one that is not Unicode reads as absent.
pub(crate) fn var(config: &Config, name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(value) => Some(value),
        Err(VarError::NotPresent) => config.env_file().get(name).map(str::to_owned),
        Err(VarError::NotUnicode(_)) => None,
    }
}

/// The env file's variables that the process environment lacks: what a child process (a stdio
/// MCP server) inherits besides the process environment, as it would in the reference, where
/// the file is loaded into the process environment.
#[cfg(feature = "mcp")]
pub(crate) fn file_only(config: &Config) -> impl Iterator<Item = (&str, &str)> {
    config
        .env_file()
        .iter()
        .filter(|(name, _)| std::env::var_os(name).is_none())
}
