//! `ExportSpan`: a span as this crate exports it, and its conversion to the SDK's `SpanData`
//! with every text redacted.

use std::borrow::Cow;
use std::time::SystemTime;

use chrono::{DateTime, Utc};
use opentelemetry::trace::{self, SpanContext, TraceFlags, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue, Value as OtelValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use serde_json::Value;

use crate::ids::{SpanId, TraceId};
use crate::redact::Redactor;

/// The OpenTelemetry kind of a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtelKind {
    /// Work inside the process (a run, a step, a tool call).
    Internal,
    /// A call to a remote service (a model).
    Client,
}

/// How a span ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportStatus {
    /// Not said.
    Unset,
    /// Ended normally.
    Ok,
    /// Ended in error, with a description.
    Error(String),
}

/// Something that happened inside a span.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportEvent {
    /// Its name.
    pub name: String,
    /// When.
    pub time: DateTime<Utc>,
    /// What it says.
    pub attributes: Vec<(String, Value)>,
}

/// A finished span to export, with explicit times (the journal's).
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSpan {
    /// Its trace.
    pub trace_id: TraceId,
    /// Its id.
    pub span_id: SpanId,
    /// Its parent, absent for a trace's root.
    pub parent_span_id: Option<SpanId>,
    /// Its name (`invoke_agent devis`, `chat fake-1`, `execute_tool prix_ttc`…).
    pub name: String,
    /// Its OpenTelemetry kind.
    pub kind: OtelKind,
    /// When it started.
    pub start: DateTime<Utc>,
    /// When it ended.
    pub end: DateTime<Utc>,
    /// How it ended.
    pub status: ExportStatus,
    /// Its attributes; JSON arrays and objects are exported as their JSON text.
    pub attributes: Vec<(String, Value)>,
    /// Its events.
    pub events: Vec<ExportEvent>,
}

fn time(at: DateTime<Utc>) -> SystemTime {
    SystemTime::from(at)
}

fn value(value: &Value, redactor: &Redactor) -> Option<OtelValue> {
    match value {
        Value::Null => None,
        Value::Bool(flag) => Some(OtelValue::Bool(*flag)),
        Value::Number(number) => number
            .as_i64()
            .map(OtelValue::I64)
            .or_else(|| number.as_f64().map(OtelValue::F64)),
        Value::String(text) => Some(OtelValue::String(redactor.redact(text).into_owned().into())),
        Value::Array(_) | Value::Object(_) => Some(OtelValue::String(
            redactor.redact(&value.to_string()).into_owned().into(),
        )),
    }
}

fn attributes(pairs: &[(String, Value)], redactor: &Redactor) -> Vec<KeyValue> {
    pairs
        .iter()
        .filter_map(|(key, raw)| value(raw, redactor).map(|v| KeyValue::new(key.clone(), v)))
        .collect()
}

impl ExportSpan {
    /// The SDK's span data, every text (names, attribute values, event attributes, the status
    /// description) passed through `redactor`.
    pub(crate) fn to_span_data(
        &self,
        redactor: &Redactor,
        scope: &InstrumentationScope,
    ) -> SpanData {
        let context = SpanContext::new(
            trace::TraceId::from_bytes(self.trace_id.0),
            trace::SpanId::from_bytes(self.span_id.0),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let events = self
            .events
            .iter()
            .map(|event| {
                opentelemetry::trace::Event::new(
                    redactor.redact(&event.name).into_owned(),
                    time(event.time),
                    attributes(&event.attributes, redactor),
                    0,
                )
            })
            .collect();
        let status = match &self.status {
            ExportStatus::Unset => trace::Status::Unset,
            ExportStatus::Ok => trace::Status::Ok,
            ExportStatus::Error(description) => trace::Status::Error {
                description: Cow::Owned(redactor.redact(description).into_owned()),
            },
        };
        SpanData {
            span_context: context,
            parent_span_id: self
                .parent_span_id
                .map_or(trace::SpanId::INVALID, |id| trace::SpanId::from_bytes(id.0)),
            parent_span_is_remote: false,
            span_kind: match self.kind {
                OtelKind::Internal => trace::SpanKind::Internal,
                OtelKind::Client => trace::SpanKind::Client,
            },
            name: Cow::Owned(redactor.redact(&self.name).into_owned()),
            start_time: time(self.start),
            end_time: time(self.end),
            attributes: attributes(&self.attributes, redactor),
            dropped_attributes_count: 0,
            events: {
                let mut list = SpanEvents::default();
                list.events = events;
                list
            },
            links: SpanLinks::default(),
            status,
            instrumentation_scope: scope.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{span_id, trace_id};
    use crate::redact::Pattern;
    use serde_json::json;

    #[test]
    fn every_text_is_redacted_and_values_keep_their_type() {
        let at = DateTime::parse_from_rfc3339("2026-11-29T11:57:50.022235Z")
            .unwrap()
            .with_timezone(&Utc);
        let span = ExportSpan {
            trace_id: trace_id("default", "r"),
            span_id: span_id("s"),
            parent_span_id: Some(span_id("p")),
            name: "execute_tool envoyer".into(),
            kind: OtelKind::Client,
            start: at,
            end: at,
            status: ExportStatus::Error("to a@b.fr".into()),
            attributes: vec![
                ("n".into(), json!(3)),
                ("cost".into(), json!(0.5)),
                ("flag".into(), json!(true)),
                ("none".into(), Value::Null),
                ("args".into(), json!({"to": "a@b.fr"})),
            ],
            events: vec![ExportEvent {
                name: "policy.decided".into(),
                time: at,
                attributes: vec![("loom.reason".into(), json!("mail x@y.org"))],
            }],
        };
        let redactor = Redactor::new(&[Pattern::Email]).unwrap();
        let data = span.to_span_data(&redactor, &InstrumentationScope::builder("t").build());
        let text = format!("{data:?}");
        assert!(
            !text.contains("a@b.fr") && !text.contains("x@y.org"),
            "{text}"
        );
        assert_eq!(data.attributes.len(), 4);
        assert_eq!(data.attributes[0].value, OtelValue::I64(3));
        assert_eq!(data.attributes[1].value, OtelValue::F64(0.5));
        assert_eq!(
            data.attributes[3].value.as_str(),
            r#"{"to":"[REDACTED:email]"}"#
        );
        assert_eq!(data.parent_span_id.to_bytes(), span_id("p").0);
        assert_eq!(data.start_time, SystemTime::from(at));
        assert_eq!(data.span_kind, trace::SpanKind::Client);
    }
}
