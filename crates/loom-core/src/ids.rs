//! Identifier rules shared by every layer.
//!
//! Loom generates UUIDv7 strings for the ids it chooses; callers may choose run and session ids
//! themselves, within [`is_safe_id`] (they become file names in the JSONL journal).

/// Whether `id` matches `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`, the shape allowed for tenant,
/// session and run ids (they become file names).
pub fn is_safe_id(id: &str) -> bool {
    let bytes = id.as_bytes();
    match bytes.first() {
        Some(first) if first.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    bytes.len() <= 128
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whether `name` is a valid tool or agent name: `^[A-Za-z0-9_-]{1,64}$`.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_ids() {
        assert!(is_safe_id("plain-run-1"));
        assert!(is_safe_id("01a2272b-2a46-75bb-bb32-13148c9b02a6"));
        assert!(!is_safe_id(""));
        assert!(!is_safe_id(".hidden"));
        assert!(!is_safe_id("a/b"));
        assert!(!is_safe_id(&"a".repeat(129)));
    }

    #[test]
    fn names() {
        assert!(is_valid_name("prix_ttc"));
        assert!(!is_valid_name("loom.fetch"));
        assert!(!is_valid_name(""));
    }
}
