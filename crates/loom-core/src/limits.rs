//! Bounds on what a caller may put in the journal: how deep a JSON value it sends may nest and
//! how large it may be.
//!
//! Every value a caller supplies (run metadata, a message, corrected tool arguments, a reason)
//! ends up inside an event, itself a few levels of JSON deep, and must read back: a value nested
//! near the JSON reader's recursion limit would be accepted, journaled and then never read again.
//! The access paths check these bounds before anything is written and refuse with a
//! [`LimitError`] naming the field and the limit; the journal itself refuses any event that would
//! not read back ([`crate::journal::batch_journal`]).

use serde::Serialize;
use serde_json::Value;

/// Most levels a caller's JSON value may nest (an object or array is one level; the reference
/// caps `metadata` at 64).
pub const MAX_DEPTH: usize = 64;

/// Most bytes of a run's `metadata`, as compact JSON.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;

/// Most bytes of a message's text (a run's request, a steering message).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// Most bytes of corrected tool arguments, as compact JSON.
pub const MAX_ARGUMENTS_BYTES: usize = 1024 * 1024;

/// Most bytes of a short label: a user id, who decided or cancelled, an attachment's name.
pub const MAX_LABEL_BYTES: usize = 1024;

/// Most bytes of a free note: the reason of a decision.
pub const MAX_NOTE_BYTES: usize = 64 * 1024;

/// A caller's value over one of the bounds: refused before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// The value nests deeper than [`MAX_DEPTH`].
    #[error("{field} is nested more than {limit} levels deep (limit {limit} levels)")]
    TooDeep {
        /// The field, as the caller names it (`metadata`, `arguments`).
        field: String,
        /// The limit.
        limit: usize,
    },
    /// The value is larger than its limit.
    #[error("{field} is {bytes} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        /// The field, as the caller names it.
        field: String,
        /// Its size (compact JSON for a value, UTF-8 for a text).
        bytes: usize,
        /// The limit.
        limit: usize,
    },
}

/// Whether `value` nests at most `limit` levels (an object or array is one level, a scalar
/// none). Iterative, so a pathological value cannot exhaust the stack, and it stops as soon as
/// the limit is passed.
pub fn within_depth(value: &Value, limit: usize) -> bool {
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, above)) = stack.pop() {
        let depth = above + 1;
        match value {
            Value::Array(items) if depth <= limit => {
                stack.extend(items.iter().map(|child| (child, depth)));
            }
            Value::Object(fields) if depth <= limit => {
                stack.extend(fields.values().map(|child| (child, depth)));
            }
            Value::Array(_) | Value::Object(_) => return false,
            _ => {}
        }
    }
    true
}

/// The size of `value` as compact JSON.
pub fn json_bytes<T: Serialize + ?Sized>(value: &T) -> usize {
    /// Counts what is written, keeping nothing.
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Plain data with string keys cannot fail to serialize; a failure counts what was written.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Checks a caller's JSON value: at most [`MAX_DEPTH`] levels and `max_bytes` bytes as compact
/// JSON.
pub fn check_value(field: &str, value: &Value, max_bytes: usize) -> Result<(), LimitError> {
    if !within_depth(value, MAX_DEPTH) {
        return Err(LimitError::TooDeep {
            field: field.to_owned(),
            limit: MAX_DEPTH,
        });
    }
    let bytes = json_bytes(value);
    if bytes > max_bytes {
        return Err(LimitError::TooLarge {
            field: field.to_owned(),
            bytes,
            limit: max_bytes,
        });
    }
    Ok(())
}

/// Checks a caller's object (run metadata): the object is the first of its [`MAX_DEPTH`]
/// levels, and at most `max_bytes` bytes as compact JSON.
pub fn check_object(
    field: &str,
    object: &serde_json::Map<String, Value>,
    max_bytes: usize,
) -> Result<(), LimitError> {
    let deep = object
        .values()
        .any(|value| !within_depth(value, MAX_DEPTH - 1));
    if deep {
        return Err(LimitError::TooDeep {
            field: field.to_owned(),
            limit: MAX_DEPTH,
        });
    }
    let bytes = json_bytes(object);
    if bytes > max_bytes {
        return Err(LimitError::TooLarge {
            field: field.to_owned(),
            bytes,
            limit: max_bytes,
        });
    }
    Ok(())
}

/// Checks a caller's text: at most `max_bytes` bytes of UTF-8.
pub fn check_text(field: &str, text: &str, max_bytes: usize) -> Result<(), LimitError> {
    if text.len() > max_bytes {
        return Err(LimitError::TooLarge {
            field: field.to_owned(),
            bytes: text.len(),
            limit: max_bytes,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// `levels` nested objects around `1`.
    fn nested(levels: usize) -> Value {
        (0..levels).fold(json!(1), |inner, _| json!({ "a": inner }))
    }

    #[test]
    fn depth_counts_objects_and_arrays_not_scalars() {
        assert!(within_depth(&json!(1), 0));
        assert!(!within_depth(&json!({}), 0));
        assert!(within_depth(&json!({}), 1));
        assert!(within_depth(&json!([[1], {"a": [2]}]), 3));
        assert!(!within_depth(&json!([[1], {"a": [2]}]), 2));
        assert!(within_depth(&nested(64), 64));
        assert!(!within_depth(&nested(65), 64));
    }

    #[test]
    fn a_value_over_a_bound_is_refused_naming_the_field_and_the_limit() {
        assert_eq!(check_value("arguments", &nested(64), 1024), Ok(()));
        assert_eq!(
            check_value("arguments", &nested(125), 1024)
                .unwrap_err()
                .to_string(),
            "arguments is nested more than 64 levels deep (limit 64 levels)"
        );
        assert_eq!(
            check_value("arguments", &json!("abcdef"), 4)
                .unwrap_err()
                .to_string(),
            "arguments is 8 bytes, more than the limit of 4 bytes"
        );
        assert_eq!(
            check_text("message", "héllo", 5).unwrap_err().to_string(),
            "message is 6 bytes, more than the limit of 5 bytes"
        );
    }

    #[test]
    fn an_object_is_its_own_first_level() {
        let Value::Object(ok) = nested(64) else {
            unreachable!()
        };
        assert_eq!(check_object("metadata", &ok, MAX_METADATA_BYTES), Ok(()));
        let Value::Object(deep) = nested(65) else {
            unreachable!()
        };
        assert!(matches!(
            check_object("metadata", &deep, MAX_METADATA_BYTES),
            Err(LimitError::TooDeep { limit: 64, .. })
        ));
        assert_eq!(json_bytes(&ok), json_bytes(&nested(64)));
    }
}
