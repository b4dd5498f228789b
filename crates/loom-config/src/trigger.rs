//! `triggers`: the webhooks of `loom serve` (`POST /v1/hooks/{name}`).
//!
//! A trigger exists because its caller does not know Loom's API: a scheduler, a CRM or a
//! payment gateway sends its own JSON. The trigger says what to do with it: which agent runs,
//! with which message (a template over the payload) and in which session. The tenant comes from
//! the caller's API key, never from the trigger or the payload.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The variables a trigger's `message` and `session` templates may use.
pub const TRIGGER_VARIABLES: [&str; 3] = ["payload", "trigger", "delivery"];

/// One webhook (`triggers[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TriggerSpec {
    /// Unique name, the last segment of its route (`^[a-z0-9][a-z0-9_-]{0,63}$`).
    #[schemars(regex(pattern = r"^[a-z0-9][a-z0-9_-]{0,63}$"))]
    pub name: String,
    /// The agent each delivery runs (in the background).
    pub agent: String,
    /// The run's message: a minijinja template over `payload` (the request's JSON body,
    /// `none` when the body is empty), `trigger` (this trigger's name) and `delivery` (the
    /// delivery id, or `none`). Strict: a variable or field missing from the payload refuses
    /// the delivery.
    pub message: String,
    /// The run's session, a template over the same variables (absent: each run is its own
    /// session).
    #[serde(default)]
    pub session: Option<String>,
    /// The request header carrying the sender's delivery id (`X-GitHub-Delivery`…). The
    /// delivery id becomes the run id, so a redelivery finds its first run instead of opening
    /// another.
    #[serde(default)]
    pub delivery_header: Option<String>,
    /// The environment variable holding the trigger's signing secret, shared with the sender.
    /// When set, a delivery must be signed: `X-Loom-Timestamp` (Unix seconds) and
    /// `X-Loom-Signature: v1=<hex HMAC-SHA256 of "<timestamp>.<raw body>" keyed by the
    /// secret>`, within `signature_tolerance` of the server's clock; anything else is refused
    /// (401) before the payload is read.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// Seconds a signed delivery's timestamp may be away from the server's clock (replays
    /// older than that are refused).
    #[serde(default = "default_signature_tolerance")]
    #[schemars(range(min = 1))]
    pub signature_tolerance: u64,
    /// The tenant of the runs a signed delivery opens (needs `secret_env`; default `default`).
    /// A signed delivery is authenticated by its signature: senders such as payment or forge
    /// services cannot add an API key, so none is asked for, and this names the tenant the key
    /// would have. An unsigned delivery needs a key, which decides the tenant.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// Five minutes, as the services that sign their webhooks allow.
fn default_signature_tolerance() -> u64 {
    DEFAULT_SIGNATURE_TOLERANCE
}

/// The default `signature_tolerance`, in seconds.
pub const DEFAULT_SIGNATURE_TOLERANCE: u64 = 300;

impl TriggerSpec {
    /// The tenant of a signed delivery's run: `tenant`, else `default`. `None` for a trigger
    /// without `secret_env`, whose deliveries take the tenant of the caller's key.
    pub fn signed_tenant(&self) -> Option<&str> {
        self.secret_env
            .as_ref()
            .map(|_| self.tenant.as_deref().unwrap_or(crate::DEFAULT_TENANT))
    }

    /// A trigger running `agent` on `message`, without session template or delivery header.
    pub fn new(
        name: impl Into<String>,
        agent: impl Into<String>,
        message: impl Into<String>,
    ) -> TriggerSpec {
        TriggerSpec {
            name: name.into(),
            agent: agent.into(),
            message: message.into(),
            session: None,
            delivery_header: None,
            secret_env: None,
            signature_tolerance: DEFAULT_SIGNATURE_TOLERANCE,
            tenant: None,
        }
    }
}

/// What a trigger's templates gave for one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedTrigger {
    /// The run's message.
    pub message: String,
    /// The run's session, when the trigger has a `session` template (trimmed).
    pub session: Option<String>,
}

/// Whether `name` is a usable trigger name: `^[a-z0-9][a-z0-9_-]{0,63}$`.
pub fn is_trigger_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.len() <= 64
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Whether `name` is a usable environment variable name (`[A-Za-z_][A-Za-z0-9_]*`).
pub(crate) fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Whether `name` is a usable HTTP header name (an RFC 9110 token).
pub(crate) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "orders", "0-stripe_v2", &"a".repeat(64)] {
            assert!(is_trigger_name(ok), "{ok}");
        }
        for bad in ["", "Orders", "-a", "_a", "a.b", "a b", &"a".repeat(65)] {
            assert!(!is_trigger_name(bad), "{bad}");
        }
        assert!(is_header_name("X-GitHub-Delivery"));
        assert!(!is_header_name("X Delivery"));
        assert!(!is_header_name(""));
        assert!(is_env_name("ORDERS_HOOK_SECRET") && is_env_name("_x1"));
        assert!(!is_env_name("") && !is_env_name("1X") && !is_env_name("A-B"));
    }
}
