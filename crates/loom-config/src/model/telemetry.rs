//! `telemetry`: logs (level, format), what is captured (raw model exchanges, content in exported
//! spans), the redaction applied to exported spans, and the OpenTelemetry exporters.

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
    /// What is masked in every text of an exported span before it leaves the process.
    pub redaction: RedactionConfig,
    /// Where traces are exported (OpenTelemetry over OTLP/HTTP); none by default.
    pub exporters: Vec<ExporterConfig>,
}

/// What exported spans carry (`telemetry.capture.exports`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CaptureExports {
    /// Names, ids, times, models, tools, tokens and cost; no message, argument, result or
    /// reason.
    #[default]
    Metadata,
    /// Metadata and content (messages, tool arguments and results), redacted.
    Content,
}

/// `telemetry.redaction`: the patterns replaced by `[REDACTED:<name>]` in exported spans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RedactionConfig {
    /// Built-in patterns by name (`secret`, `email`, `phone`, `iban`) and the deployment's own
    /// (`{name, regex}`); all four built-in ones by default.
    pub patterns: Vec<RedactionPattern>,
}

impl Default for RedactionConfig {
    fn default() -> Self {
        RedactionConfig {
            patterns: REDACTION_PATTERNS
                .iter()
                .map(|name| RedactionPattern::Named((*name).to_owned()))
                .collect(),
        }
    }
}

/// The built-in redaction patterns, by name.
pub const REDACTION_PATTERNS: &[&str] = &["secret", "email", "phone", "iban"];

/// One redaction pattern.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RedactionPattern {
    /// A built-in pattern: `secret` (API keys, bearer tokens), `email`, `phone`, `iban`.
    Named(String),
    /// A named regular expression.
    Custom {
        /// Shown in the replacement, `[REDACTED:<name>]`.
        name: String,
        /// A regular expression (Rust `regex` syntax).
        regex: String,
    },
}

/// What an exporter sends (`telemetry.exporters[].type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExporterKind {
    /// OpenTelemetry traces over OTLP.
    #[default]
    Otel,
}

/// The OTLP transport (`telemetry.exporters[].protocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OtlpProtocol {
    /// Protobuf over HTTP, to `<endpoint>/v1/traces`.
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// gRPC: refused at load (Loom exports over HTTP only).
    #[serde(rename = "grpc")]
    Grpc,
}

/// One exporter (`telemetry.exporters[]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ExporterConfig {
    /// What it sends.
    #[serde(rename = "type")]
    pub kind: ExporterKind,
    /// The variable holding the receiver's base URL (`http://localhost:4318`, to which
    /// `/v1/traces` is appended); when unset, `http://localhost:4318`.
    pub endpoint_env: String,
    /// The transport.
    pub protocol: OtlpProtocol,
    /// The variable holding the request headers, `key=value` pairs separated by commas (as
    /// `OTEL_EXPORTER_OTLP_HEADERS`).
    pub headers_env: Option<String>,
    /// The `service.name` of the exported spans.
    pub service_name: String,
    /// Seconds one export may take.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub timeout: f64,
}

impl Default for ExporterConfig {
    fn default() -> Self {
        ExporterConfig {
            kind: ExporterKind::Otel,
            endpoint_env: "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            protocol: OtlpProtocol::HttpProtobuf,
            headers_env: None,
            service_name: "loom".to_owned(),
            timeout: 10.0,
        }
    }
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
    /// What exported spans carry: `metadata` (the default) or `content` too (needs an
    /// exporter).
    pub exports: CaptureExports,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            raw_exchanges: false,
            raw_max_bytes: 262_144,
            exports: CaptureExports::Metadata,
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
