//! The payload sealed at rest ([`SealedPayload`]) and how an event's payload is written and read:
//! sealed as `{"sealed", "key_id"}` without `type`, any other in its tagged form.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::Payload;

/// A payload as written: a sealed one is `{"sealed", "key_id"}`, any other its tagged form.
pub(super) fn ser_payload<S: Serializer>(payload: &Payload, s: S) -> Result<S::Ok, S::Error> {
    match payload {
        Payload::Sealed(sealed) => sealed.serialize(s),
        clear => clear.serialize(s),
    }
}

/// A payload as read: an object with `sealed` and without `type` is a sealed payload, anything
/// else a tagged payload.
///
/// The first key decides the path: a payload whose first key is `type` (as Loom and the
/// reference write it) is read straight into its variant's struct (`payload::read_typed`: no
/// intermediate buffer, unlike serde's internally tagged reader); an unknown `type` goes to the
/// derived reader, its `type` replayed ([`TypeFirst`]), for its error; any other object is
/// gathered first, then read by the rule above (a sealed payload is two short strings).
pub(super) fn de_payload<'de, D: Deserializer<'de>>(d: D) -> Result<Payload, D::Error> {
    d.deserialize_map(PayloadVisitor)
}

struct PayloadVisitor;

impl<'de> serde::de::Visitor<'de> for PayloadVisitor {
    type Value = Payload;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a payload object (with its `type`, or sealed)")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Payload, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return Payload::deserialize(Value::Object(Map::new()))
                .map_err(serde::de::Error::custom);
        };
        if first == "type" {
            let tag: String = map.next_value()?;
            let map = match super::payload::read_typed(&tag, map) {
                Ok(read) => return read,
                Err(map) => map,
            };
            return Payload::deserialize(serde::de::value::MapAccessDeserializer::new(TypeFirst {
                tag: Some(tag),
                key_given: false,
                rest: map,
            }));
        }
        let mut object = Map::new();
        let value: Value = map.next_value()?;
        object.insert(first, value);
        while let Some((key, value)) = map.next_entry::<String, Value>()? {
            object.insert(key, value);
        }
        if object.contains_key("sealed") && !object.contains_key("type") {
            SealedPayload::deserialize(Value::Object(object))
                .map(Payload::Sealed)
                .map_err(serde::de::Error::custom)
        } else {
            Payload::deserialize(Value::Object(object)).map_err(serde::de::Error::custom)
        }
    }
}

/// The entries of a payload object whose `type` (its first key) was already read: `type` and
/// its value replayed, then the rest of the object as it comes.
struct TypeFirst<M> {
    tag: Option<String>,
    key_given: bool,
    rest: M,
}

impl<'de, M: serde::de::MapAccess<'de>> serde::de::MapAccess<'de> for TypeFirst<M> {
    type Error = M::Error;

    fn next_key_seed<K: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, M::Error> {
        if self.tag.is_some() && !self.key_given {
            self.key_given = true;
            return seed
                .deserialize(serde::de::value::StrDeserializer::<M::Error>::new("type"))
                .map(Some);
        }
        self.rest.next_key_seed(seed)
    }

    fn next_value_seed<V: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, M::Error> {
        match self.tag.take() {
            Some(tag) => {
                seed.deserialize(serde::de::value::StringDeserializer::<M::Error>::new(tag))
            }
            None => self.rest.next_value_seed(seed),
        }
    }
}

/// A payload sealed at rest (`storage.encryption`, reference §9): AES-256-GCM of the clear
/// payload's JSON with one of the tenant's keys, bound to its envelope.
///
/// Only journals hold it: the sealing journal (`loom-crypto`) opens every sealed payload before
/// an event leaves it, so no reader, projection or engine code is ever handed one (the
/// projection refuses it, [`crate::state::RunState::apply`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedPayload {
    /// Base64 (standard, padded) of the 12-byte nonce followed by the ciphertext and its tag.
    pub sealed: String,
    /// The first 12 hex digits of `sha256("loom.key.v1" + key)`: which key sealed it.
    pub key_id: String,
}

impl SealedPayload {
    /// The length of a key id, in hex digits.
    pub const KEY_ID_LEN: usize = 12;

    /// Refuses what cannot be a sealed payload: an empty seal, a key id that is not 12
    /// lowercase hex digits.
    pub fn check(&self) -> Result<(), String> {
        let hex = self.key_id.len() == Self::KEY_ID_LEN
            && self
                .key_id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex {
            return Err(format!(
                "sealed payload with an ill-formed key_id {:?} (expected 12 hex digits)",
                self.key_id
            ));
        }
        if self.sealed.is_empty() {
            return Err("sealed payload without its ciphertext".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Envelope, Event, EventReadError, LINE, RunContext, RunStarted};

    /// A payload read straight into its variant (its `type` first) is what serde's derived
    /// reader makes of it; an unknown `type` is refused by the derived reader's message.
    #[test]
    fn the_direct_read_agrees_with_the_derived_reader() {
        let line: Value = serde_json::from_str(LINE).unwrap();
        let derived = Payload::deserialize(line["payload"].clone()).unwrap();
        assert_eq!(Event::from_json(LINE).unwrap().payload, derived);
        let unknown = LINE.replace(
            r#""type":"tool.completed","call_id""#,
            r#""type":"tool.nope","call_id""#,
        );
        assert_ne!(unknown, LINE);
        let EventReadError::Json(message) = Event::from_json(&unknown).unwrap_err() else {
            panic!("an unknown payload type is a JSON error");
        };
        assert!(message.contains("unknown variant `tool.nope`"), "{message}");
        // A missing field of the variant is named.
        let missing = LINE.replace(r#""call_id":"fake_0_0","#, "");
        assert_ne!(missing, LINE);
        let EventReadError::Json(message) = Event::from_json(&missing).unwrap_err() else {
            panic!("a payload missing a field is a JSON error");
        };
        assert!(message.contains("call_id"), "{message}");
    }

    /// A sealed payload (`{"sealed", "key_id"}`, no `type`) reads as [`Payload::Sealed`] and is
    /// written back byte for byte; its envelope is not compared with it; an ill-formed key id is
    /// refused, and the projection refuses to fold it.
    #[test]
    fn a_sealed_payload_reads_and_writes_as_the_reference_writes_it() {
        let start = LINE.find(r#""payload":{"#).unwrap();
        let end = LINE.find(r#","seq":10"#).unwrap();
        let sealed = format!(
            r#"{}"payload":{{"sealed":"AAECAwQFBgcICQoL","key_id":"4ed42d1a2576"}}{}"#,
            &LINE[..start],
            &LINE[end..]
        );
        let event = Event::from_json(&sealed).unwrap();
        assert_eq!(
            event.payload,
            Payload::Sealed(SealedPayload {
                sealed: "AAECAwQFBgcICQoL".into(),
                key_id: "4ed42d1a2576".into(),
            })
        );
        assert_eq!(event.event_type, "tool.completed");
        assert_eq!(event.to_json(), sealed);
        let bad = sealed.replace("4ed42d1a2576", "4ED42D1A2576");
        assert!(matches!(
            Event::from_json(&bad).unwrap_err(),
            EventReadError::Invalid { .. }
        ));
        // A payload with `type` is never taken for a sealed one.
        let typed = sealed.replace(r#"{"sealed""#, r#"{"type":"tool.completed","sealed""#);
        assert!(Event::from_json(&typed).is_err());
        // Keys in another order read the same: `key_id` first, or `type` after other fields.
        let reordered = sealed.replace(
            r#"{"sealed":"AAECAwQFBgcICQoL","key_id":"4ed42d1a2576"}"#,
            r#"{"key_id":"4ed42d1a2576","sealed":"AAECAwQFBgcICQoL"}"#,
        );
        assert_eq!(Event::from_json(&reordered).unwrap(), event);
        let type_last = LINE.replace(
            r#""payload":{"type":"tool.completed","call_id":"fake_0_0","#,
            r#""payload":{"call_id":"fake_0_0","#,
        );
        let type_last = type_last.replace(
            r#""cost_usd":0.0},"seq""#,
            r#""cost_usd":0.0,"type":"tool.completed"},"seq""#,
        );
        assert_ne!(type_last, LINE);
        assert_eq!(
            Event::from_json(&type_last).unwrap(),
            Event::from_json(LINE).unwrap()
        );
        let envelope = Envelope {
            event_id: "e0".into(),
            ts: event.ts,
            tenant_id: event.tenant_id.clone(),
            session_id: event.session_id.clone(),
            run_id: event.run_id.clone(),
            root_run_id: event.root_run_id.clone(),
            span_id: "sp".into(),
            parent_span_id: None,
            agent: None,
            role: None,
        };
        let started = Event::new(
            envelope,
            Payload::RunStarted(RunStarted {
                kind: "normal".into(),
                context: RunContext {
                    tenant_id: event.tenant_id.clone(),
                    user_id: None,
                    metadata: Map::new(),
                },
                parent_run_id: None,
                parent_call_id: None,
                depth: 0,
                triggered_by: None,
                trigger: None,
                judges: "auto".into(),
                budget: None,
                state: Map::new(),
            }),
        );
        let mut state = crate::state::RunState::start(&started).unwrap();
        let refused = state.apply(&event).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("sealed payload that was not opened"),
            "{refused}"
        );
    }
}
