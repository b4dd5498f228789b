//! `telemetry`: logs (level, format) and the capture of raw model exchanges.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Telemetry settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Logs.
    pub logging: LoggingConfig,
    /// What is captured beyond the events themselves.
    pub capture: CaptureConfig,
}

/// Capture settings (`telemetry.capture`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureConfig {
    /// Journal the raw HTTP exchange of every model attempt as a `model.exchanged` event (API
    /// keys redacted, file bytes replaced by their size).
    pub raw_exchanges: bool,
    /// Bytes kept of each request and response body in `model.exchanged` (the size and SHA-256
    /// are always those of the full body).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub raw_max_bytes: u64,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            raw_exchanges: false,
            raw_max_bytes: 262_144,
        }
    }
}

impl CaptureConfig {
    /// The body limit of raw-exchange capture, when it is on.
    pub fn raw_limit(&self) -> Option<usize> {
        self.raw_exchanges
            .then(|| usize::try_from(self.raw_max_bytes).unwrap_or(usize::MAX))
    }
}

/// Log settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    /// ERROR, WARNING (or WARN), INFO, DEBUG or TRACE, case-insensitive.
    #[schemars(regex(
        pattern = r"^([Ee][Rr][Rr][Oo][Rr]|[Ww][Aa][Rr][Nn]([Ii][Nn][Gg])?|[Ii][Nn][Ff][Oo]|[Dd][Ee][Bb][Uu][Gg]|[Tt][Rr][Aa][Cc][Ee])$"
    ))]
    pub level: String,
    /// Output format.
    pub format: LogFormat,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            level: "INFO".to_owned(),
            format: LogFormat::Console,
        }
    }
}

impl LoggingConfig {
    /// The parsed level; `None` when `level` is not a known name.
    pub fn level(&self) -> Option<LogLevel> {
        LogLevel::parse(&self.level)
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable.
    #[default]
    Console,
    /// One JSON object per line.
    Json,
}

/// A log level, parsed from [`LoggingConfig::level`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and above (`WARNING` or `WARN`).
    Warn,
    /// Informational and above.
    Info,
    /// Debug and above.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// Parses a level name, case-insensitively.
    pub fn parse(text: &str) -> Option<LogLevel> {
        match text.to_ascii_uppercase().as_str() {
            "ERROR" => Some(LogLevel::Error),
            "WARNING" | "WARN" => Some(LogLevel::Warn),
            "INFO" => Some(LogLevel::Info),
            "DEBUG" => Some(LogLevel::Debug),
            "TRACE" => Some(LogLevel::Trace),
            _ => None,
        }
    }
}
