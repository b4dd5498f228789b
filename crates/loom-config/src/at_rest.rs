//! The file model of what happens to stored data over time: `storage.encryption` (sealing at
//! rest with each tenant's key) and `storage.retention` (how long a dormant session is kept).
//! Their rules are checked in `config/at_rest.rs`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `storage.encryption`: the payload of every event written and the bytes of every file stored
/// are sealed (AES-256-GCM) with the tenant's key; envelopes (ids, time, type, status, agent,
/// facets) stay clear, so everything that filters still filters.
///
/// `keys` holds secret **names**, not keys: each tenant redirects a name to its own variable
/// (`tenants[].secrets`), which makes a key the tenant's own, and deleting that variable makes
/// its journal unreadable for good (crypto-shredding) without touching anyone else's. The first
/// name seals, all open: put a new key first to rotate, and remove the old one once nothing
/// sealed with it is needed. A key is 32 bytes in standard base64 (`openssl rand -base64 32`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EncryptionStorage {
    /// Secret names, in order: the first seals, all open (at least one, no duplicates).
    pub keys: Vec<String>,
}

/// `storage.retention`: sessions whose last write is older than `events_days` go whole
/// (journal, files, idempotency keys), as a GDPR erasure would, when `loom retention --yes`
/// sweeps; nothing is erased on its own.
///
/// The bound is decided on a session's last write, never on its content: a sealed journal whose
/// key is gone can still be erased. A session is erased even when a run in it waits for an
/// approval: a bound shorter than an approval's delay destroys pending approvals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionStorage {
    /// Days since a session's last write after which it is erased (`null`, the default, keeps
    /// everything).
    #[schemars(range(min = 1))]
    pub events_days: Option<u32>,
}
