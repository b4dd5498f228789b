//! `security`: the API keys of `loom serve` (`security.api_keys[]`).
//!
//! A key is stored only as `sha256:<64 hex>` of the key itself; the key decides the tenant,
//! the scopes and the agents of every request made with it.

use chrono::{DateTime, NaiveDate, NaiveTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `security`: what protects the API.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecurityConfig {
    /// The API keys; without any, the API is open (tenant `default`, every scope).
    #[serde(default)]
    pub api_keys: Vec<ApiKeySpec>,
}

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Open and cancel runs.
    Run,
    /// Read agents, runs and events.
    Read,
    /// Read content fields (messages, outputs) unmasked.
    ReadContent,
    /// Approve or reject tool calls.
    Approve,
    /// Everything, and administrative operations.
    Admin,
}

impl Scope {
    /// The scope's name in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Run => "run",
            Scope::Read => "read",
            Scope::ReadContent => "read_content",
            Scope::Approve => "approve",
            Scope::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scope {
    type Err = String;

    fn from_str(text: &str) -> Result<Scope, String> {
        match text {
            "run" => Ok(Scope::Run),
            "read" => Ok(Scope::Read),
            "read_content" => Ok(Scope::ReadContent),
            "approve" => Ok(Scope::Approve),
            "admin" => Ok(Scope::Admin),
            other => Err(format!(
                "unknown scope '{other}' (expected run, read, read_content, approve or admin)"
            )),
        }
    }
}

/// One API key (`security.api_keys[]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiKeySpec {
    /// Unique id, named in logs and errors (never the key itself).
    pub id: String,
    /// `sha256:<64 lowercase hex>` of the key.
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub hash: String,
    /// The tenant every request made with the key acts for.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// When the key stops working: an RFC 3339 date-time, or a date (`2027-01-01`: from its
    /// first instant, UTC). Absent: never.
    #[serde(default)]
    pub expires: Option<String>,
    /// What the key may do.
    #[serde(default = "default_scopes")]
    pub scopes: Vec<Scope>,
    /// The agents the key may use; empty: every agent of its tenant.
    #[serde(default)]
    pub agents: Vec<String>,
    /// How many requests the key may make per minute (sliding window, per server); absent:
    /// no limit.
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
}

/// The rate of requests an API key may make (`security.api_keys[].rate_limit`), checked by
/// `loom serve` on every `/v1` request made with the key: over it, HTTP 429 with
/// `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Requests per sliding minute (at least 1).
    #[schemars(range(min = 1))]
    pub per_minute: u32,
}

fn default_tenant() -> String {
    crate::DEFAULT_TENANT.to_owned()
}

fn default_scopes() -> Vec<Scope> {
    vec![Scope::Run, Scope::Read]
}

impl ApiKeySpec {
    /// The instant the key expires, when `expires` is set and readable (it is checked at load).
    pub fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.expires.as_deref().and_then(parse_expiry)
    }

    /// Whether the key has the scope (`admin` has every scope).
    pub fn allows(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope) || self.scopes.contains(&Scope::Admin)
    }

    /// Whether the key may use `agent` (an empty `agents` list allows all).
    pub fn allows_agent(&self, agent: &str) -> bool {
        self.agents.is_empty() || self.agents.iter().any(|a| a == agent)
    }
}

/// Reads an `expires` value: an RFC 3339 date-time or a `YYYY-MM-DD` date (its first instant,
/// UTC).
pub fn parse_expiry(text: &str) -> Option<DateTime<Utc>> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Some(at.with_timezone(&Utc));
    }
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .ok()
        .map(|date| date.and_time(NaiveTime::MIN).and_utc())
}

/// Whether `hash` reads `sha256:` followed by 64 lowercase hex digits.
pub fn is_key_hash(hash: &str) -> bool {
    hash.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}
