//! The file and URL readers of `add_file` / `add_url`, configured from the settings.

use std::time::Duration;

use loom_notes_core::Settings;
use loom_notes_sources::{FetchSettings, FileAccess, UrlFetcher};

/// The file reader: the allowed roots and deny patterns of the settings.
pub(crate) fn files(settings: &Settings) -> FileAccess {
    FileAccess::new(
        settings.allowed_roots.clone(),
        settings.deny_patterns.clone(),
    )
}

/// The page fetcher: timeout, size limit, private addresses and user agent of the settings.
pub(crate) fn fetcher(settings: &Settings) -> anyhow::Result<UrlFetcher> {
    let timeout = Duration::try_from_secs_f64(settings.fetch_timeout_s).map_err(|_| {
        anyhow::anyhow!(
            "LOOM_NOTES_FETCH_TIMEOUT_S: {} seconds is not a usable timeout",
            settings.fetch_timeout_s
        )
    })?;
    let options = FetchSettings {
        timeout,
        max_bytes: settings.fetch_max_bytes,
        allow_private: settings.fetch_allow_private,
        user_agent: settings.user_agent.clone(),
        ..FetchSettings::default()
    };
    Ok(UrlFetcher::new(options)?)
}
