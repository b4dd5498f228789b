//! A tenant's keys: the secrets `storage.encryption.keys` names, as the facade reads them for
//! the tenant ([`KeySource`]), made into keys for one journal operation ([`Keyring`]).
//!
//! There is no cache: every journal or file operation reads the tenant's secrets again, so a
//! secret that disappears (a deleted variable, a removed file) makes the tenant's sealed content
//! unreadable from the next operation on — crypto-shredding without a restart, as far as the
//! source reads its values live. Parsing a key costs a base64 decode, a SHA-256 and an AES key
//! schedule, once per operation, not per event.

use loom_core::ports::StoreError;

use crate::seal::{Key, SealError};

/// One secret of a tenant's key list, as the facade found it.
#[derive(Clone, PartialEq, Eq)]
pub struct KeySecret {
    /// The secret's name, as `storage.encryption.keys` lists it.
    pub name: String,
    /// Where its value was looked for (e.g. `variable MARTIN_JOURNAL_KEY`), for errors.
    pub origin: String,
    /// Its value, `None` when it is not set.
    pub value: Option<String>,
}

impl std::fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySecret")
            .field("name", &self.name)
            .field("origin", &self.origin)
            .field("set", &self.value.is_some())
            .finish()
    }
}

/// Where the sealing stores read a tenant's keys: the facade, which knows the configuration and
/// each tenant's secrets.
pub trait KeySource: Send + Sync + std::fmt::Debug {
    /// The tenant's key secrets in the configured order (the first seals, all open); empty when
    /// nothing is sealed (no `storage.encryption`).
    fn keys(&self, tenant_id: &str) -> Vec<KeySecret>;
}

/// The keys of one tenant for one operation.
#[derive(Debug)]
pub struct Keyring {
    tenant_id: String,
    keys: Vec<(KeySecret, Option<Result<Key, SealError>>)>,
}

impl Keyring {
    /// The tenant's keys as `source` gives them now.
    pub fn of(source: &dyn KeySource, tenant_id: &str) -> Keyring {
        let keys = source
            .keys(tenant_id)
            .into_iter()
            .map(|secret| {
                let key = secret.value.as_deref().map(Key::from_base64);
                (secret, key)
            })
            .collect();
        Keyring {
            tenant_id: tenant_id.to_owned(),
            keys,
        }
    }

    /// Whether the tenant's content is sealed at all (some key is declared).
    pub fn seals(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The key that seals new content (the first): [`StoreError::MissingKey`] when its secret is
    /// not set, [`StoreError::Unsealable`] when its value is not a key.
    pub fn sealing(&self, what: &str) -> Result<&Key, StoreError> {
        match self.keys.first() {
            Some((_, Some(Ok(key)))) => Ok(key),
            Some((secret, Some(Err(error)))) => Err(StoreError::Unsealable {
                tenant_id: self.tenant_id.clone(),
                what: what.to_owned(),
                reason: format!("its key '{}' ({}): {error}", secret.name, secret.origin),
            }),
            Some((secret, None)) => Err(StoreError::MissingKey {
                tenant_id: self.tenant_id.clone(),
                key_id: format!("'{}'", secret.name),
                reason: format!(
                    "the key that seals new content is not set ({}), so nothing is written",
                    secret.origin
                ),
            }),
            None => Err(StoreError::MissingKey {
                tenant_id: self.tenant_id.clone(),
                key_id: "to seal with".into(),
                reason: "storage.encryption declares no key".into(),
            }),
        }
    }

    /// The key whose id is `key_id`: [`StoreError::MissingKey`], naming what the tenant has,
    /// when none of its keys has it.
    pub fn opening(&self, key_id: &str) -> Result<&Key, StoreError> {
        let found = self.keys.iter().find_map(|(_, key)| match key {
            Some(Ok(key)) if key.id() == key_id => Some(key),
            _ => None,
        });
        found.ok_or_else(|| StoreError::MissingKey {
            tenant_id: self.tenant_id.clone(),
            key_id: key_id.to_owned(),
            reason: self.describe(),
        })
    }

    /// What the tenant has, for a missing key: each key with its id, or why it has none.
    fn describe(&self) -> String {
        if self.keys.is_empty() {
            return "storage.encryption declares no key: the content was sealed with a key this \
                    configuration does not name"
                .into();
        }
        let keys: Vec<String> = self
            .keys
            .iter()
            .map(|(secret, key)| match key {
                Some(Ok(key)) => format!("'{}' has id {}", secret.name, key.id()),
                Some(Err(error)) => {
                    format!("'{}' ({}) is unusable: {error}", secret.name, secret.origin)
                }
                None => format!("'{}' is not set ({})", secret.name, secret.origin),
            })
            .collect();
        format!(
            "none of its keys opens it ({}); a deleted key cannot be recovered",
            keys.join("; ")
        )
    }
}
