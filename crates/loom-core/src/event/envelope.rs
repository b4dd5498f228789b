//! The envelope of an event ([`Event`], [`Envelope`]): how an event is built from its payload,
//! read from a journal line and checked against it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::sealed::{de_payload, ser_payload};
use super::{Category, EventReadError, EventStatus, Payload, SCHEMA_VERSION, de_ts, ser_ts};

/// A journaled fact.
///
/// Its JSON Schema (`schemars`) describes the envelope; the payload is described as an object
/// whose `type` is the event type (the schema of each payload type is not part of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Event {
    /// UUIDv7, chosen when the event is built.
    pub event_id: String,
    /// When it was built (UTC, microseconds).
    #[serde(serialize_with = "ser_ts", deserialize_with = "de_ts")]
    pub ts: DateTime<Utc>,
    /// Always [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Tenant.
    pub tenant_id: String,
    /// Session (equal to `run_id` for a run without session).
    pub session_id: String,
    /// Run.
    pub run_id: String,
    /// Root of the run tree.
    pub root_run_id: String,
    /// Span of the event.
    pub span_id: String,
    /// Parent span.
    pub parent_span_id: Option<String>,
    /// Payload type string (derived).
    #[serde(rename = "type")]
    pub event_type: String,
    /// Category (derived).
    pub category: Category,
    /// Status (derived).
    pub status: EventStatus,
    /// Agent running.
    pub agent: Option<String>,
    /// Model slot (`main`, a role name, `judge:<n>`) for model events.
    pub role: Option<String>,
    /// Scalar summary of the payload (derived), for queries and traces.
    pub facets: Map<String, Value>,
    /// What happened. On disk, a payload sealed at rest (`storage.encryption`) is
    /// `{"sealed", "key_id"}` without a `type` ([`Payload::Sealed`]); every other payload carries
    /// its `type`.
    #[schemars(schema_with = "payload_schema")]
    #[serde(serialize_with = "ser_payload", deserialize_with = "de_payload")]
    pub payload: Payload,
    /// Position in the session journal, from 1, assigned by the store (0 until appended).
    #[serde(default)]
    pub seq: u64,
}

/// Where an event sits: everything in the envelope that is not derived from the payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// Event id.
    pub event_id: String,
    /// Timestamp.
    pub ts: DateTime<Utc>,
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// Run.
    pub run_id: String,
    /// Root run.
    pub root_run_id: String,
    /// Span.
    pub span_id: String,
    /// Parent span.
    pub parent_span_id: Option<String>,
    /// Agent.
    pub agent: Option<String>,
    /// Role.
    pub role: Option<String>,
}

impl Event {
    /// Builds an event from its envelope and payload, deriving type, category, status and facets.
    pub fn new(envelope: Envelope, payload: Payload) -> Event {
        Event {
            event_id: envelope.event_id,
            ts: envelope.ts,
            schema_version: SCHEMA_VERSION,
            tenant_id: envelope.tenant_id,
            session_id: envelope.session_id,
            run_id: envelope.run_id,
            root_run_id: envelope.root_run_id,
            span_id: envelope.span_id,
            parent_span_id: envelope.parent_span_id,
            event_type: payload.type_name().to_owned(),
            category: payload.category(),
            status: payload.status(),
            agent: envelope.agent,
            role: envelope.role,
            facets: payload.facets(),
            payload,
            seq: 0,
        }
    }

    /// Parses one journal line and checks it: schema version, derived fields, invariants.
    pub fn from_json(line: &str) -> Result<Event, EventReadError> {
        let event: Event = serde_json::from_str(line).map_err(|e| {
            let id = serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| v.get("event_id").and_then(Value::as_str).map(str::to_owned));
            match id {
                Some(id) => EventReadError::Json(format!("event {id}: {e}")),
                None => EventReadError::Json(e.to_string()),
            }
        })?;
        event.check()?;
        Ok(event)
    }

    /// Checks the derived fields and the payload invariants.
    ///
    /// A sealed payload ([`Payload::Sealed`]) cannot be compared with its envelope: only its
    /// shape is checked here, and the whole event once it is opened (the envelope's derived
    /// fields must then match the clear payload).
    pub fn check(&self) -> Result<(), EventReadError> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(EventReadError::Version {
                event_id: self.event_id.clone(),
                found: self.schema_version,
            });
        }
        if let Payload::Sealed(sealed) = &self.payload {
            return sealed.check().map_err(|reason| EventReadError::Invalid {
                event_id: self.event_id.clone(),
                seq: self.seq,
                reason,
            });
        }
        let inconsistent = |field| EventReadError::Inconsistent {
            event_id: self.event_id.clone(),
            seq: self.seq,
            field,
        };
        if self.event_type != self.payload.type_name() {
            return Err(inconsistent("type"));
        }
        if self.category != self.payload.category() {
            return Err(inconsistent("category"));
        }
        if self.status != self.payload.status() {
            return Err(inconsistent("status"));
        }
        if !self.payload.has_facets(&self.facets) {
            return Err(inconsistent("facets"));
        }
        if let Err(reason) = self.payload.check() {
            return Err(EventReadError::Invalid {
                event_id: self.event_id.clone(),
                seq: self.seq,
                reason,
            });
        }
        Ok(())
    }

    /// The event as one compact JSON line (without the newline).
    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The schema of [`Event::payload`]: an object whose `type` is the event type, with the fields
/// of that type.
fn payload_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "What happened: the fields of the event type named by `type` (the same as the envelope's).",
        "properties": {"type": {"type": "string"}},
        "required": ["type"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::LINE;

    #[test]
    fn reference_line_round_trips_byte_for_byte() {
        let event = Event::from_json(LINE).unwrap();
        assert_eq!(event.seq, 10);
        assert_eq!(event.to_json(), LINE);
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let line = LINE.replace(r#""seq":10"#, r#""seq":10,"later":{"x":1}"#);
        assert!(Event::from_json(&line).is_ok());
    }

    #[test]
    fn contradicting_envelope_is_refused_with_the_event_named() {
        let line = LINE.replace(r#""status":"ok""#, r#""status":"error""#);
        let err = Event::from_json(&line).unwrap_err();
        assert!(matches!(
            err,
            EventReadError::Inconsistent {
                field: "status",
                ..
            }
        ));
        assert!(
            err.to_string()
                .contains("01a2272b-2a5d-7c60-ae0f-8690fd14d194")
        );
        let line = LINE.replace(r#""size":164,"is_error""#, r#""size":165,"is_error""#);
        assert!(matches!(
            Event::from_json(&line).unwrap_err(),
            EventReadError::Inconsistent {
                field: "facets",
                ..
            }
        ));
    }

    /// The facets are checked without being built: a facet missing, added, or of another
    /// value or type is refused, and the reference's own facets are accepted.
    #[test]
    fn facets_that_are_not_the_payloads_are_refused() {
        let facets = r#""facets":{"tool_name":"calculer","latency_ms":0.351611999974466,"size":164,"is_error":false}"#;
        assert!(LINE.contains(facets));
        for wrong in [
            r#""facets":{"tool_name":"calculer","latency_ms":0.351611999974466,"size":164}"#,
            r#""facets":{"tool_name":"calculer","latency_ms":0.351611999974466,"size":164,"is_error":false,"x":1}"#,
            r#""facets":{"tool_name":"calculer","latency_ms":0.351611999974466,"size":164.0,"is_error":false}"#,
            r#""facets":{"tool_name":"calculer","latency_ms":0.35,"size":164,"is_error":false}"#,
            r#""facets":{"tool_name":"calcul","latency_ms":0.351611999974466,"size":164,"is_error":false}"#,
            r#""facets":{"tool_name":"calculer","latency_ms":0.351611999974466,"size":164,"is_error":null}"#,
            r#""facets":{"tool_name":"calculer","latency_ms":0.351611999974466,"size":"164","is_error":false}"#,
        ] {
            let line = LINE.replace(facets, wrong);
            assert!(
                matches!(
                    Event::from_json(&line),
                    Err(EventReadError::Inconsistent {
                        field: "facets",
                        ..
                    })
                ),
                "{wrong}"
            );
        }
        // The same facets in another order are the same facets.
        let reordered = r#""facets":{"is_error":false,"size":164,"latency_ms":0.351611999974466,"tool_name":"calculer"}"#;
        assert!(Event::from_json(&LINE.replace(facets, reordered)).is_ok());
    }

    #[test]
    fn other_schema_versions_are_refused() {
        let line = LINE.replace(r#""schema_version":1"#, r#""schema_version":2"#);
        assert!(matches!(
            Event::from_json(&line).unwrap_err(),
            EventReadError::Version { found: 2, .. }
        ));
    }
}
