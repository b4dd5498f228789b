//! The payloads of model calls: `model.responded`, `model.retried`, `model.fell_back` and
//! `model.exchanged` (the raw HTTP exchange, opt-in).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{content::Message, model::HttpExchange, usage::Usage};

/// `model.responded`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponded {
    /// Provider model name.
    pub model_id: String,
    /// Config model id.
    #[serde(default)]
    pub model: Option<String>,
    /// Provider.
    pub provider: String,
    /// The answer.
    pub message: Message,
    /// Tokens.
    pub usage: Usage,
    /// Cost.
    pub cost_usd: f64,
    /// Why it stopped.
    pub stop_reason: crate::model::StopReason,
    /// Latency.
    pub latency_ms: f64,
    /// Attempts made.
    #[serde(default = "one")]
    pub attempts: u32,
    /// SHA-256 of the canonical request.
    #[serde(default)]
    pub request_hash: Option<String>,
    /// Per-part hashes of the request.
    #[serde(default)]
    pub request_parts: Map<String, Value>,
    /// Role call this answers.
    #[serde(default)]
    pub call_id: Option<String>,
    /// Judge this answers.
    #[serde(default)]
    pub judge: Option<String>,
}

fn one() -> u32 {
    1
}

/// `model.retried`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRetried {
    /// Provider model name.
    pub model_id: String,
    /// Config model id.
    #[serde(default)]
    pub model: Option<String>,
    /// Provider.
    pub provider: String,
    /// The attempt that failed, from 1.
    pub attempt: u32,
    /// The error kind (`transient`, `overloaded`, …).
    pub error_kind: String,
    /// The error message.
    pub error: String,
    /// HTTP status, when there was one.
    #[serde(default)]
    pub http_status: Option<u16>,
    /// Seconds waited before the next attempt (0 for a final, billed failure).
    pub delay_s: f64,
    /// Role call involved.
    #[serde(default)]
    pub call_id: Option<String>,
    /// Judge involved.
    #[serde(default)]
    pub judge: Option<String>,
    /// Tokens billed by the failed attempt, when known.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Their cost.
    #[serde(default)]
    pub cost_usd: f64,
    /// Whether no attempt follows.
    #[serde(default)]
    pub r#final: bool,
}

/// `model.fell_back`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelFellBack {
    /// `main`, a role name or `judge:<name>`.
    pub slot: String,
    /// Config id of the model left.
    pub from_model: String,
    /// Config id of the model used from now on.
    pub to_model: String,
    /// The error kind, or "circuit_open".
    pub reason: String,
    /// The error message.
    #[serde(default)]
    pub error: Option<String>,
    /// Role call involved.
    #[serde(default)]
    pub call_id: Option<String>,
    /// Judge involved.
    #[serde(default)]
    pub judge: Option<String>,
}

/// `model.exchanged`: the raw HTTP exchange of one attempt of a model call, written only when
/// `telemetry.capture.raw_exchanges` is on. API keys are redacted and file bytes replaced by
/// their size; bodies are cut at `raw_max_bytes` (sizes and hashes are the full bodies').
///
/// Content fields (never exported): the headers, the bodies and `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelExchanged {
    /// Provider model name.
    pub model_id: String,
    /// Config model id.
    #[serde(default)]
    pub model: Option<String>,
    /// Provider.
    pub provider: String,
    /// The attempt, from 1.
    pub attempt: u32,
    /// HTTP method.
    pub method: String,
    /// Request URL.
    pub url: String,
    /// Response status; null when no response arrived.
    #[serde(default)]
    pub status_code: Option<u16>,
    /// From sending the request to the end of the response.
    pub duration_ms: f64,
    /// Request headers (credentials redacted).
    #[serde(default)]
    pub request_headers: BTreeMap<String, String>,
    /// Request body (file bytes replaced, cut at the limit).
    #[serde(default)]
    pub request_body: String,
    /// Size of the full request body.
    pub request_bytes: u64,
    /// SHA-256 (hex) of the full request body.
    pub request_sha256: String,
    /// Whether `request_body` was cut.
    #[serde(default)]
    pub request_truncated: bool,
    /// Response headers (credentials redacted).
    #[serde(default)]
    pub response_headers: BTreeMap<String, String>,
    /// Response body as received (cut at the limit).
    #[serde(default)]
    pub response_body: String,
    /// Size of the response body received.
    pub response_bytes: u64,
    /// SHA-256 (hex) of the response body received.
    pub response_sha256: String,
    /// Whether `response_body` was cut.
    #[serde(default)]
    pub response_truncated: bool,
    /// The error that ended the exchange.
    #[serde(default)]
    pub error: Option<String>,
    /// Built by Loom rather than observed on the wire.
    #[serde(default)]
    pub synthetic: bool,
    /// Role call involved.
    #[serde(default)]
    pub call_id: Option<String>,
    /// Judge involved.
    #[serde(default)]
    pub judge: Option<String>,
}

impl ModelExchanged {
    /// The event of `exchange`, observed on the wire (`synthetic` false), for the main slot.
    pub fn observed(
        exchange: HttpExchange,
        model_id: String,
        model: Option<String>,
        provider: String,
        attempt: u32,
    ) -> ModelExchanged {
        ModelExchanged {
            model_id,
            model,
            provider,
            attempt,
            method: exchange.method,
            url: exchange.url,
            status_code: exchange.status_code,
            duration_ms: exchange.duration_ms,
            request_headers: exchange.request_headers,
            request_body: exchange.request_body,
            request_bytes: exchange.request_bytes,
            request_sha256: exchange.request_sha256,
            request_truncated: exchange.request_truncated,
            response_headers: exchange.response_headers,
            response_body: exchange.response_body,
            response_bytes: exchange.response_bytes,
            response_sha256: exchange.response_sha256,
            response_truncated: exchange.response_truncated,
            error: exchange.error,
            synthetic: false,
            call_id: None,
            judge: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;

    use super::*;
    use crate::event::{Category, Envelope, Event, EventStatus, Payload};

    fn exchanged(status_code: Option<u16>, error: Option<&str>) -> Event {
        let exchange = HttpExchange {
            method: "POST".into(),
            url: "https://api.anthropic.com/v1/messages".into(),
            status_code,
            duration_ms: 12.5,
            request_bytes: 300,
            response_bytes: 40,
            error: error.map(str::to_owned),
            ..HttpExchange::default()
        };
        let payload = Payload::ModelExchanged(ModelExchanged::observed(
            exchange,
            "claude-sonnet-4-5".into(),
            Some("claude".into()),
            "anthropic".into(),
            2,
        ));
        let envelope = Envelope {
            event_id: "e".into(),
            ts: DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default(),
            tenant_id: "default".into(),
            session_id: "s".into(),
            run_id: "s".into(),
            root_run_id: "s".into(),
            span_id: "p".into(),
            parent_span_id: None,
            agent: Some("a".into()),
            role: Some("main".into()),
        };
        Event::new(envelope, payload)
    }

    #[test]
    fn model_exchanged_status_facets_and_round_trip() {
        let ok = exchanged(Some(200), None);
        assert_eq!(ok.event_type, "model.exchanged");
        assert_eq!(ok.category, Category::Model);
        assert_eq!(ok.status, EventStatus::Ok);
        let keys: Vec<&str> = ok.facets.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "model_id",
                "provider",
                "attempt",
                "status_code",
                "duration_ms",
                "request_bytes",
                "response_bytes",
                "model"
            ]
        );
        assert_eq!(Event::from_json(&ok.to_json()).unwrap(), ok);
        assert_eq!(exchanged(Some(529), None).status, EventStatus::Warning);
        assert_eq!(
            exchanged(Some(200), Some("stream interrupted")).status,
            EventStatus::Warning
        );
        let none = exchanged(None, Some("network error"));
        assert_eq!(none.status, EventStatus::Warning);
        assert_eq!(none.facets["status_code"], Value::Null);
    }
}
