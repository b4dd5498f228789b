//! Provider errors and their classification.

use std::time::Duration;

use loom_core::model::{ModelError, ModelErrorKind};

/// The classes of provider error ([`class_of`] gives them, by the reference's rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Bad or missing key (401, 403, `authentication_error`, `permission_error`,
    /// `invalid_api_key`).
    Auth,
    /// Credit or quota exhausted (402, `insufficient_quota`, `billing_error`, Anthropic credit
    /// balance).
    Quota,
    /// The prompt does not fit (`context_length_exceeded`, `prompt is too long`).
    ContextLength,
    /// Refused by the provider's content filter (`content_filter`,
    /// `content_policy_violation`).
    ContentFiltered,
    /// Worth retrying: 408, 409, 429 rate limits, 5xx, server errors, truncated streams.
    Transient,
    /// The provider is overloaded (503, 529, `overloaded_error`, `server_overloaded`): worth
    /// retrying, reported apart.
    Overloaded,
    /// Anything else the request itself got wrong (other 4xx).
    Invalid,
}

/// Classifies a provider error by the reference's rules (Loom-IA `classify_error`), checked in
/// this order, the first that applies deciding:
///
/// | class | when |
/// |---|---|
/// | quota | a hint `insufficient_quota`, `billing_error` or `billing_hard_limit_reached`, or HTTP 402 |
/// | context length | a hint `context_length_exceeded` or `string_above_max_length`, or (no status, 400 or 413) a message that says `prompt is too long`, `context length`, `context window`, `maximum context` or `too many (input) tokens` |
/// | content filtered | a hint `content_filter` or `content_policy_violation` |
/// | auth | a hint `authentication_error`, `permission_error` or `invalid_api_key`, or HTTP 401 / 403 |
/// | overloaded | a hint `overloaded_error` or `server_overloaded`, or HTTP 503 / 529 |
/// | transient | a hint `rate_limit_error`, `rate_limit_exceeded`, `api_error`, `timeout_error` or `server_error`, or HTTP 408 / 409 / 429; then no status at all, or HTTP 500 and above |
/// | invalid | anything else |
///
/// `hints` are the provider's error type and code; `message` is read only by the context-length
/// rule, where providers give no code.
pub fn class_of(status: Option<u16>, hints: &[&str], message: &str) -> ErrorClass {
    let hint = |names: &[&str]| hints.iter().any(|h| names.contains(h));
    if hint(&[
        "insufficient_quota",
        "billing_error",
        "billing_hard_limit_reached",
    ]) || status == Some(402)
    {
        return ErrorClass::Quota;
    }
    if hint(&["context_length_exceeded", "string_above_max_length"])
        || (matches!(status, None | Some(400 | 413)) && says_context_overflow(message))
    {
        return ErrorClass::ContextLength;
    }
    if hint(&["content_filter", "content_policy_violation"]) {
        return ErrorClass::ContentFiltered;
    }
    if hint(&[
        "authentication_error",
        "permission_error",
        "invalid_api_key",
    ]) || matches!(status, Some(401 | 403))
    {
        return ErrorClass::Auth;
    }
    if hint(&["overloaded_error", "server_overloaded"]) || matches!(status, Some(503 | 529)) {
        return ErrorClass::Overloaded;
    }
    if hint(&[
        "rate_limit_error",
        "rate_limit_exceeded",
        "api_error",
        "timeout_error",
        "server_error",
    ]) || matches!(status, Some(408 | 409 | 429))
    {
        return ErrorClass::Transient;
    }
    match status {
        None => ErrorClass::Transient,
        Some(s) if s >= 500 => ErrorClass::Transient,
        Some(_) => ErrorClass::Invalid,
    }
}

/// Whether a provider's message says the prompt does not fit (the reference's pattern
/// `prompt is too long|context (length|window)|maximum context|too many (input )?tokens`, in
/// any case).
fn says_context_overflow(message: &str) -> bool {
    let lower = message.to_lowercase();
    [
        "prompt is too long",
        "context length",
        "context window",
        "maximum context",
        "too many tokens",
        "too many input tokens",
    ]
    .iter()
    .any(|pattern| lower.contains(pattern))
}

impl ErrorClass {
    /// The model error kind the engine acts on.
    pub fn kind(self) -> ModelErrorKind {
        match self {
            ErrorClass::Auth => ModelErrorKind::Auth,
            ErrorClass::Quota => ModelErrorKind::QuotaExhausted,
            ErrorClass::ContextLength => ModelErrorKind::ContextOverflow,
            ErrorClass::ContentFiltered => ModelErrorKind::ContentFiltered,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row of the reference's table, and the order between them: the first rule that
    /// applies decides.
    #[test]
    fn the_reference_rules_apply_in_order() {
        let cases: &[(Option<u16>, &[&str], &str, ErrorClass)] = &[
            (Some(402), &[], "", ErrorClass::Quota),
            (Some(429), &["insufficient_quota"], "", ErrorClass::Quota),
            // Quota before auth and before context length.
            (Some(401), &["billing_error"], "", ErrorClass::Quota),
            (
                Some(400),
                &["billing_hard_limit_reached"],
                "prompt is too long",
                ErrorClass::Quota,
            ),
            (
                Some(400),
                &["context_length_exceeded"],
                "",
                ErrorClass::ContextLength,
            ),
            (
                Some(500),
                &["string_above_max_length"],
                "",
                ErrorClass::ContextLength,
            ),
            (None, &[], "Prompt is too long", ErrorClass::ContextLength),
            (
                Some(400),
                &[],
                "maximum context length is 8192",
                ErrorClass::ContextLength,
            ),
            (Some(413), &[], "too many tokens", ErrorClass::ContextLength),
            (
                Some(400),
                &[],
                "the context window is full",
                ErrorClass::ContextLength,
            ),
            // Read from the message only for no status, 400 or 413.
            (Some(429), &[], "prompt is too long", ErrorClass::Transient),
            (Some(404), &[], "context length", ErrorClass::Invalid),
            // Context length before the content filter, the filter before auth.
            (
                Some(400),
                &["content_filter"],
                "context window",
                ErrorClass::ContextLength,
            ),
            (
                Some(403),
                &["content_policy_violation"],
                "",
                ErrorClass::ContentFiltered,
            ),
            (Some(401), &[], "", ErrorClass::Auth),
            (Some(403), &[], "", ErrorClass::Auth),
            (Some(400), &["invalid_api_key"], "", ErrorClass::Auth),
            (Some(200), &["permission_error"], "", ErrorClass::Auth),
            // Auth before overloaded, overloaded before transient.
            (Some(503), &["authentication_error"], "", ErrorClass::Auth),
            (Some(503), &[], "", ErrorClass::Overloaded),
            (Some(529), &[], "", ErrorClass::Overloaded),
            (Some(429), &["overloaded_error"], "", ErrorClass::Overloaded),
            (None, &["server_overloaded"], "", ErrorClass::Overloaded),
            (
                Some(503),
                &["rate_limit_exceeded"],
                "",
                ErrorClass::Overloaded,
            ),
            (Some(429), &[], "", ErrorClass::Transient),
            (Some(408), &[], "", ErrorClass::Transient),
            (Some(409), &[], "", ErrorClass::Transient),
            (Some(400), &["rate_limit_error"], "", ErrorClass::Transient),
            (Some(400), &["api_error"], "", ErrorClass::Transient),
            (Some(400), &["timeout_error"], "", ErrorClass::Transient),
            (Some(400), &["server_error"], "", ErrorClass::Transient),
            (None, &[], "", ErrorClass::Transient),
            (None, &["invalid_request_error"], "", ErrorClass::Transient),
            (Some(500), &[], "", ErrorClass::Transient),
            (Some(502), &[], "", ErrorClass::Transient),
            (Some(400), &[], "", ErrorClass::Invalid),
            (Some(404), &["not_found_error"], "", ErrorClass::Invalid),
            (Some(422), &[], "", ErrorClass::Invalid),
        ];
        for (status, hints, message, expected) in cases {
            assert_eq!(
                class_of(*status, hints, message),
                *expected,
                "status {status:?}, hints {hints:?}, message {message:?}"
            );
        }
    }

    #[test]
    fn retryable_classes_are_transient_and_overloaded() {
        assert!(ErrorClass::Transient.retryable());
        assert!(ErrorClass::Overloaded.retryable());
        assert!(!ErrorClass::ContentFiltered.retryable());
        assert_eq!(
            ErrorClass::ContentFiltered.kind(),
            ModelErrorKind::ContentFiltered
        );
    }
}
