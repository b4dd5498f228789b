//! Provider errors and their classification.

use std::time::Duration;

use loom_core::model::{ModelError, ModelErrorKind};

/// The classes of provider error (`EXPECTED.md` of the provider fixtures), in the order the
/// rules are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Bad or missing key (401, 403, `authentication_error`, `invalid_api_key`).
    Auth,
    /// Credit or quota exhausted (`insufficient_quota`, Anthropic credit balance).
    Quota,
    /// The prompt does not fit (`context_length_exceeded`, `prompt is too long`).
    ContextLength,
    /// Worth retrying: 429 rate limits, 5xx, overloaded, truncated streams.
    Transient,
    /// Anthropic 529 / `overloaded_error`: transient, reported apart.
    Overloaded,
    /// Anything else the request itself got wrong (other 4xx).
    Invalid,
}

impl ErrorClass {
    /// The model error kind the engine acts on.
    pub fn kind(self) -> ModelErrorKind {
        match self {
            ErrorClass::Auth => ModelErrorKind::Auth,
            ErrorClass::Quota => ModelErrorKind::QuotaExhausted,
            ErrorClass::ContextLength => ModelErrorKind::ContextOverflow,
            ErrorClass::Transient => ModelErrorKind::Transient,
            ErrorClass::Overloaded => ModelErrorKind::Overloaded,
            ErrorClass::Invalid => ModelErrorKind::InvalidRequest,
        }
    }

    /// Whether the same request may succeed later.
    pub fn retryable(self) -> bool {
        matches!(self, ErrorClass::Transient | ErrorClass::Overloaded)
    }
}

/// A classified provider error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ProviderError {
    /// Class.
    pub class: ErrorClass,
    /// HTTP status, when there was one.
    pub status: Option<u16>,
    /// The provider's error type or code (`rate_limit_error`, `insufficient_quota`…).
    pub provider_code: Option<String>,
    /// The provider's message.
    pub message: String,
    /// Delay asked for (`retry-after-ms`, `retry-after` seconds or HTTP date).
    pub retry_after: Option<Duration>,
}

impl From<ProviderError> for ModelError {
    fn from(error: ProviderError) -> ModelError {
        ModelError {
            kind: error.class.kind(),
            message: error.message,
            http_status: error.status,
            retry_after: error.retry_after,
        }
    }
}

/// The delay a response asks for: `retry-after-ms`, else `retry-after` (seconds or HTTP date).
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return Duration::try_from_secs_f64(ms / 1000.0).ok();
    }
    let value = text("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(
        date.duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    )
}

/// A stream that ended before its terminal marker: transient.
pub fn truncated(provider: &str) -> ProviderError {
    ProviderError {
        class: ErrorClass::Transient,
        status: None,
        provider_code: None,
        message: format!("stream interrupted: {provider} closed the stream without an end signal"),
        retry_after: None,
    }
}
