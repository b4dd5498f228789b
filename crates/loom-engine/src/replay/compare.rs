//! The first divergence between a run's recorded events and its replay's.
//!
//! Both sides are compared event by event, in journal order, as JSON, after three steps:
//!
//! - events that say how the run was carried rather than what it decided are left out:
//!   `run.claimed` (leases and their renewals depend on time), `model.exchanged` (the raw HTTP
//!   exchange: a replay makes none) and `session.*` (snapshots and compactions belong to the
//!   session, not the run);
//! - the volatile fields are removed: from the envelope `event_id`, `ts`, `seq`, `span_id`,
//!   `parent_span_id`; from the payload and the facets the fields of [`VOLATILE_FIELDS`]
//!   (measured durations, retry waits, leases, workers, event ids, expiry instants);
//! - the ids of the replay's sub-runs (new UUIDs) are replaced by the recorded ones, paired by
//!   the order of their `run.started`.
//!
//! Everything else is compared, the model requests' hashes included: `model.responded` carries
//! `request_hash` and `request_parts` (model, system, tools, messages, settings), compared
//! first, so a changed prompt, tool list or setting is named by its part.

use std::collections::HashMap;

use loom_core::Event;
use serde_json::{Map, Value};

/// Payload and facet fields that differ from one execution to the next and are not compared.
pub const VOLATILE_FIELDS: &[&str] = &[
    "latency_ms",
    "duration_ms",
    // A retry's wait: jittered at random, and not waited in a replay.
    "delay_s",
    "worker_id",
    "lease_until",
    "cause_event_id",
    "output_event_id",
    "expire_at",
];

/// Envelope fields that are not compared.
const VOLATILE_ENVELOPE: &[&str] = &["event_id", "ts", "seq", "span_id", "parent_span_id"];

/// Event types that are not compared.
fn compared(event: &Event) -> bool {
    let kind = event.payload.type_name();
    !(kind == "run.claimed" || kind == "model.exchanged" || kind.starts_with("session."))
}

/// Where a replay first differs from its journal.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Divergence {
    /// The recorded event's seq (`None` when the replay wrote more events than the journal).
    pub seq: Option<u64>,
    /// The recorded event's type, or the replay's when the journal had no more.
    pub event_type: String,
    /// The run the event belongs to (the recorded id).
    pub run_id: String,
    /// The JSON path of the first field that differs (`payload.request_parts.system`), or
    /// `type` when the events are of different types, or empty when one side has no event.
    pub field: String,
    /// The recorded value (`null` when absent).
    pub expected: Value,
    /// The replay's value (`null` when absent).
    pub got: Value,
}

/// The first divergence between `expected` (the journal) and `got` (the replay), both a run
/// and its sub-runs in journal order; `None` when they are identical.
pub fn compare(expected: &[Event], got: &[Event]) -> Option<Divergence> {
    let expected: Vec<&Event> = expected.iter().filter(|e| compared(e)).collect();
    let got: Vec<&Event> = got.iter().filter(|e| compared(e)).collect();
    let ids = run_ids(&expected, &got);
    for index in 0..expected.len().max(got.len()) {
        match (expected.get(index), got.get(index)) {
            (Some(want), Some(have)) => {
                let want_value = normalized(want, &HashMap::new());
                let have_value = normalized(have, &ids);
                if let Some((field, expected, got)) = first_difference(&want_value, &have_value) {
                    return Some(Divergence {
                        seq: Some(want.seq),
                        event_type: want.payload.type_name().to_owned(),
                        run_id: want.run_id.clone(),
                        field,
                        expected,
                        got,
                    });
                }
            }
            (Some(want), None) => {
                return Some(Divergence {
                    seq: Some(want.seq),
                    event_type: want.payload.type_name().to_owned(),
                    run_id: want.run_id.clone(),
                    field: String::new(),
                    expected: Value::String(want.payload.type_name().to_owned()),
                    got: Value::Null,
                });
            }
            (None, Some(have)) => {
                let run_id = ids.get(&have.run_id).unwrap_or(&have.run_id).clone();
                return Some(Divergence {
                    seq: None,
                    event_type: have.payload.type_name().to_owned(),
                    run_id,
                    field: String::new(),
                    expected: Value::Null,
                    got: Value::String(have.payload.type_name().to_owned()),
                });
            }
            (None, None) => break,
        }
    }
    None
}

/// The replay's run ids → the recorded ones, paired by the order of their `run.started`.
fn run_ids(expected: &[&Event], got: &[&Event]) -> HashMap<String, String> {
    let started = |events: &[&Event]| -> Vec<String> {
        events
            .iter()
            .filter(|e| e.payload.type_name() == "run.started")
            .map(|e| e.run_id.clone())
            .collect()
    };
    started(got)
        .into_iter()
        .zip(started(expected))
        .filter(|(mine, theirs)| mine != theirs)
        .collect()
}

/// The event as compared: volatile fields removed, the replay's run ids mapped.
fn normalized(event: &Event, ids: &HashMap<String, String>) -> Value {
    let mut value = serde_json::to_value(event).unwrap_or(Value::Null);
    if let Value::Object(envelope) = &mut value {
        for key in VOLATILE_ENVELOPE {
            envelope.remove(*key);
        }
        for part in ["payload", "facets"] {
            if let Some(Value::Object(fields)) = envelope.get_mut(part) {
                for key in VOLATILE_FIELDS {
                    fields.remove(*key);
                }
            }
        }
    }
    if !ids.is_empty() {
        map_ids(&mut value, ids);
    }
    value
}

fn map_ids(value: &mut Value, ids: &HashMap<String, String>) {
    match value {
        Value::String(text) => {
            if let Some(theirs) = ids.get(text.as_str()) {
                *text = theirs.clone();
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| map_ids(item, ids)),
        Value::Object(fields) => fields.values_mut().for_each(|item| map_ids(item, ids)),
        _ => {}
    }
}

/// The order fields are compared in: `type` first, then a model request's parts (so a change is
/// named by its part before its whole hash), then by name.
fn rank(key: &str) -> (u8, &str) {
    match key {
        "type" => (0, key),
        "request_parts" => (1, key),
        _ => (2, key),
    }
}

/// The first field that differs: its path, the recorded value and the replay's.
pub(super) fn first_difference(want: &Value, have: &Value) -> Option<(String, Value, Value)> {
    match (want, have) {
        (Value::Object(a), Value::Object(b)) => object_difference(a, b),
        (Value::Array(a), Value::Array(b)) => {
            for index in 0..a.len().max(b.len()) {
                let (x, y) = (a.get(index), b.get(index));
                match (x, y) {
                    (Some(x), Some(y)) => {
                        if let Some((path, e, g)) = first_difference(x, y) {
                            return Some((join(&format!("[{index}]"), &path), e, g));
                        }
                    }
                    _ => {
                        return Some((
                            format!("[{index}]"),
                            x.cloned().unwrap_or(Value::Null),
                            y.cloned().unwrap_or(Value::Null),
                        ));
                    }
                }
            }
            None
        }
        _ if want == have => None,
        _ => Some((String::new(), want.clone(), have.clone())),
    }
}

fn object_difference(
    a: &Map<String, Value>,
    b: &Map<String, Value>,
) -> Option<(String, Value, Value)> {
    let mut keys: Vec<&str> = a.keys().chain(b.keys()).map(String::as_str).collect();
    keys.sort_unstable_by(|x, y| rank(x).cmp(&rank(y)));
    keys.dedup();
    for key in keys {
        let (x, y) = (a.get(key), b.get(key));
        match (x, y) {
            (Some(x), Some(y)) => {
                if let Some((path, e, g)) = first_difference(x, y) {
                    return Some((join(key, &path), e, g));
                }
            }
            _ => {
                return Some((
                    key.to_owned(),
                    x.cloned().unwrap_or(Value::Null),
                    y.cloned().unwrap_or(Value::Null),
                ));
            }
        }
    }
    None
}

/// `head` followed by `rest` (a field or an index path).
fn join(head: &str, rest: &str) -> String {
    if rest.is_empty() {
        head.to_owned()
    } else if rest.starts_with('[') {
        format!("{head}{rest}")
    } else {
        format!("{head}.{rest}")
    }
}
