//! The message headers the queue reads and writes.
//!
//! A message's attempt number is what the queue wrote (`x-loom-attempts`: the deliveries of
//! the job's earlier messages, republished after a failure, a deferral or an early delivery)
//! plus what the broker counted for this message (`x-delivery-count`: its returns, such as a
//! worker that died or a dropped delivery).

use lapin::types::{AMQPValue, FieldTable};

/// The deliveries counted before this message was published (written by the queue).
pub(crate) const ATTEMPTS: &str = "x-loom-attempts";
/// Why a job was dead-lettered by the queue.
pub(crate) const REASON: &str = "x-loom-reason";
/// The returns of this message, counted by a quorum queue.
const DELIVERY_COUNT: &str = "x-delivery-count";
/// The broker's dead-lettering history of a message.
const DEATH: &str = "x-death";

fn integer(value: &AMQPValue) -> Option<u64> {
    match value {
        AMQPValue::ShortShortUInt(n) => Some(u64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(u64::from(*n)),
        AMQPValue::LongUInt(n) => Some(u64::from(*n)),
        AMQPValue::Timestamp(n) => Some(*n),
        AMQPValue::ShortShortInt(n) => u64::try_from(*n).ok(),
        AMQPValue::ShortInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

fn get<'h>(headers: Option<&'h FieldTable>, name: &str) -> Option<&'h AMQPValue> {
    headers?.inner().get(name)
}

fn count(headers: Option<&FieldTable>, name: &str) -> u32 {
    get(headers, name)
        .and_then(integer)
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// The deliveries of a message's job before this one.
pub(crate) fn attempt(headers: Option<&FieldTable>) -> u32 {
    count(headers, ATTEMPTS).saturating_add(count(headers, DELIVERY_COUNT))
}

/// The deliveries the queue wrote on a message (`x-loom-attempts`).
pub(crate) fn written_attempts(headers: Option<&FieldTable>) -> u32 {
    count(headers, ATTEMPTS)
}

/// The reason the queue wrote on a dead message.
pub(crate) fn reason(headers: Option<&FieldTable>) -> Option<String> {
    match get(headers, REASON)? {
        AMQPValue::LongString(text) => Some(String::from_utf8_lossy(text.as_bytes()).into_owned()),
        AMQPValue::ShortString(text) => Some(text.as_str().to_owned()),
        _ => None,
    }
}

/// The reasons the broker recorded when it dead-lettered the message (`x-death`), newest
/// first.
pub(crate) fn deaths(headers: Option<&FieldTable>) -> Vec<String> {
    let Some(AMQPValue::FieldArray(entries)) = get(headers, DEATH) else {
        return Vec::new();
    };
    entries
        .as_slice()
        .iter()
        .filter_map(
            |entry| match entry.as_field_table()?.inner().get("reason")? {
                AMQPValue::LongString(text) => {
                    Some(String::from_utf8_lossy(text.as_bytes()).into_owned())
                }
                AMQPValue::ShortString(text) => Some(text.as_str().to_owned()),
                _ => None,
            },
        )
        .collect()
}
