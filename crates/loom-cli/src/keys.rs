//! `loom keys create`: a new API key, printed once, and the `security.api_keys` entry that
//! stores only its hash.

use base64::Engine as _;
use chrono::{DateTime, Duration, Utc};
use loom_ia::config::{DEFAULT_TENANT, Scope, parse_expiry};

/// Why a key cannot be created.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyError {
    /// The system's random source failed.
    #[error("no random bytes from the system: {0}")]
    Random(String),
    /// An unusable `--expires`.
    #[error(
        "--expires '{0}' is not a duration (90d, 12h) nor a date (2027-01-01, RFC 3339 date-time)"
    )]
    Expires(String),
    /// An unusable id or tenant.
    #[error("{0}")]
    Invalid(String),
}

/// A new key: the secret, once, and what the configuration stores.
#[derive(Debug)]
pub(crate) struct NewKey {
    /// `lk_` + 43 url-safe base64 characters (256 random bits).
    pub(crate) key: String,
    /// `sha256:<64 hex>` of `key`.
    pub(crate) hash: String,
}

/// A fresh key from the operating system's CSPRNG.
pub(crate) fn generate() -> Result<NewKey, KeyError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| KeyError::Random(e.to_string()))?;
    let key = format!(
        "lk_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    );
    let hash = hash(&key);
    Ok(NewKey { key, hash })
}

/// `sha256:<hex>` of a key, as `security.api_keys[].hash` stores it and the server checks it.
pub(crate) use loom_http::key_hash as hash;

/// The instant of `--expires`: `<n>d` or `<n>h` from `now`, or a date / RFC 3339 date-time.
pub(crate) fn expiry(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, KeyError> {
    let bad = || KeyError::Expires(text.to_owned());
    let relative = |unit: char, hours: i64| -> Option<Result<DateTime<Utc>, KeyError>> {
        let count = text.strip_suffix(unit)?;
        let count: i64 = match count.parse() {
            Ok(n) if n > 0 => n,
            _ => return Some(Err(bad())),
        };
        Some(
            count
                .checked_mul(hours)
                .and_then(Duration::try_hours)
                .and_then(|d| now.checked_add_signed(d))
                .ok_or_else(bad),
        )
    };
    if let Some(at) = relative('d', 24).or_else(|| relative('h', 1)) {
        return at;
    }
    parse_expiry(text).ok_or_else(bad)
}

/// The YAML to paste into `loom.yaml`: `security.api_keys` with the one new entry.
pub(crate) fn entry(
    id: &str,
    hash: &str,
    tenant: &str,
    scopes: &[Scope],
    agents: &[String],
    expires: Option<DateTime<Utc>>,
    rate_limit: Option<u32>,
) -> Result<String, KeyError> {
    if !loom_ia::core::ids::is_safe_id(id) {
        return Err(KeyError::Invalid(format!(
            "invalid key id '{id}' (expected ^[A-Za-z0-9][A-Za-z0-9._-]{{0,127}}$)"
        )));
    }
    if !loom_ia::core::ids::is_safe_id(tenant) {
        return Err(KeyError::Invalid(format!("invalid tenant id '{tenant}'")));
    }
    let quoted = |text: &str| serde_json::Value::String(text.to_owned()).to_string();
    let mut out = String::from("security:\n  api_keys:\n");
    out.push_str(&format!("    - id: {}\n", quoted(id)));
    out.push_str(&format!("      hash: \"{hash}\"\n"));
    out.push_str(&format!("      tenant: {}\n", quoted(tenant)));
    let scopes: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    out.push_str(&format!("      scopes: [{}]\n", scopes.join(", ")));
    if !agents.is_empty() {
        let agents: Vec<String> = agents.iter().map(|a| quoted(a)).collect();
        out.push_str(&format!("      agents: [{}]\n", agents.join(", ")));
    }
    if let Some(at) = expires {
        out.push_str(&format!(
            "      expires: \"{}\"\n",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ));
    }
    match rate_limit {
        Some(0) => {
            return Err(KeyError::Invalid(
                "--rate-limit must be at least 1 request per minute".into(),
            ));
        }
        Some(per_minute) => {
            out.push_str(&format!("      rate_limit: {{per_minute: {per_minute}}}\n"));
        }
        None => {}
    }
    Ok(out)
}

/// `loom keys create`: the text to print — the key on the first line, a blank line, then the
/// `security.api_keys` entry (default scopes `run` and `read`, duplicates dropped; with
/// `rate_limit`, that many requests per minute).
pub(crate) fn create(
    id: &str,
    tenant: Option<&str>,
    scopes: &[Scope],
    agents: &[String],
    expires: Option<&str>,
    rate_limit: Option<u32>,
) -> Result<String, KeyError> {
    let expires = expires.map(|text| expiry(text, Utc::now())).transpose()?;
    let default_scopes = [Scope::Run, Scope::Read];
    let scopes = if scopes.is_empty() {
        &default_scopes[..]
    } else {
        scopes
    };
    let mut unique: Vec<Scope> = Vec::new();
    for scope in scopes {
        if !unique.contains(scope) {
            unique.push(*scope);
        }
    }
    let new = generate()?;
    let tenant = tenant.unwrap_or(DEFAULT_TENANT);
    let yaml = entry(id, &new.hash, tenant, &unique, agents, expires, rate_limit)?;
    Ok(format!("{}\n\n{yaml}", new.key))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn keys_are_lk_and_43_url_safe_chars_and_differ() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_ne!(a.key, b.key);
        let body = a.key.strip_prefix("lk_").unwrap();
        assert_eq!(body.len(), 43);
        assert!(
            body.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        );
        assert_eq!(a.hash, hash(&a.key));
        assert!(loom_ia::config::is_key_hash(&a.hash));
    }

    #[test]
    fn the_entry_carries_the_rate_limit() {
        let hash = hash("abc");
        let yaml = entry("k", &hash, "acme", &[Scope::Run], &[], None, Some(30)).unwrap();
        assert!(
            yaml.ends_with("      rate_limit: {per_minute: 30}\n"),
            "{yaml}"
        );
        let plain = entry("k", &hash, "acme", &[Scope::Run], &[], None, None).unwrap();
        assert!(!plain.contains("rate_limit"), "{plain}");
        assert!(entry("k", &hash, "acme", &[Scope::Run], &[], None, Some(0)).is_err());
    }

    #[test]
    fn known_hash() {
        assert_eq!(
            hash("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn expiry_forms() {
        let now = parse_expiry("2026-01-01T00:00:00Z").unwrap();
        assert_eq!(
            expiry("90d", now).unwrap(),
            parse_expiry("2026-04-01").unwrap()
        );
        assert_eq!(
            expiry("12h", now).unwrap(),
            parse_expiry("2026-01-01T12:00:00Z").unwrap()
        );
        assert_eq!(
            expiry("2027-01-01", now).unwrap(),
            parse_expiry("2027-01-01").unwrap()
        );
        for bad in ["0d", "-3d", "d", "soon", "12x"] {
            assert!(expiry(bad, now).is_err(), "{bad}");
        }
    }
}
