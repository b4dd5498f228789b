//! Encryption at rest (`storage.encryption`): the journal and artifact stores the configuration
//! opens are wrapped by `loom-crypto`'s sealing stores, with each tenant's keys read here.
//!
//! With the `crypto` feature, the stores are always wrapped: without `storage.encryption`
//! nothing is sealed, and a sealed line (a configuration that dropped its encryption) is a
//! missing key rather than a payload nobody can read. Without the feature, a configuration
//! declaring `storage.encryption` is refused when it is opened, naming the feature.
//!
//! Keys are read at every journal or file operation (no cache, `loom_crypto::keys`): a key
//! whose secret disappears stops opening from the next operation on. A variable of the process
//! environment or of the env file cannot change while the process runs, so with those, deleting
//! a key takes effect at the next start.

use std::sync::Arc;

use loom_config::Config;
use loom_core::ports::{ArtifactStore, EventStore};

use crate::LoomError;

/// The journal and the artifact store a Loom writes to.
type Stores = (Arc<dyn EventStore>, Arc<dyn ArtifactStore>);

/// The journal and artifact stores, sealed as the configuration says.
#[cfg(feature = "crypto")]
pub(crate) fn seal(
    config: &Config,
    store: Arc<dyn EventStore>,
    artifacts: Arc<dyn ArtifactStore>,
) -> Result<Stores, LoomError> {
    let keys: Arc<dyn loom_crypto::KeySource> = Arc::new(TenantKeys {
        config: config.clone(),
    });
    Ok((
        Arc::new(loom_crypto::SealedJournal::new(store, keys.clone())),
        Arc::new(loom_crypto::SealedArtifacts::new(artifacts, keys)),
    ))
}

/// Without the `crypto` feature, `storage.encryption` is a configuration error.
#[cfg(not(feature = "crypto"))]
pub(crate) fn seal(
    config: &Config,
    store: Arc<dyn EventStore>,
    artifacts: Arc<dyn ArtifactStore>,
) -> Result<Stores, LoomError> {
    match config.raw().storage.encryption {
        Some(_) => Err(config
            .error_at_root(
                "storage.encryption",
                "encryption needs the `crypto` feature of loom-ia, which this build lacks \
                 (loom-cli enables it by default)",
            )
            .into()),
        None => Ok((store, artifacts)),
    }
}

/// Each tenant's keys: the secrets `storage.encryption.keys` names, read for the tenant.
#[cfg(feature = "crypto")]
struct TenantKeys {
    config: Config,
}

#[cfg(feature = "crypto")]
impl std::fmt::Debug for TenantKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantKeys")
            .field("keys", &self.config.raw().storage.encryption)
            .finish()
    }
}

#[cfg(feature = "crypto")]
impl loom_crypto::KeySource for TenantKeys {
    fn keys(&self, tenant_id: &str) -> Vec<loom_crypto::KeySecret> {
        let Some(encryption) = &self.config.raw().storage.encryption else {
            return Vec::new();
        };
        encryption
            .keys
            .iter()
            .map(|name| key_secret(&self.config, tenant_id, name))
            .collect()
    }
}

/// The secret `name` of `storage.encryption.keys` for `tenant`, read through the one secret
/// resolver (`secrets.rs`): the tenant's own variable or file when `tenants[].secrets`
/// redirects the name (so each tenant has its own key), else the variable `name`. A secret
/// file that cannot be read is a missing key (logged by name and path, never by value).
#[cfg(feature = "crypto")]
fn key_secret(config: &Config, tenant: &str, name: &str) -> loom_crypto::KeySecret {
    let origin = match config.tenant_secret(tenant, name) {
        None => format!("variable {name}"),
        Some(loom_config::SecretSource::Env(variable)) => format!("variable {variable}"),
        Some(loom_config::SecretSource::File { file }) => format!("file {}", file.display()),
    };
    let value = match crate::secrets::secret(config, tenant, name) {
        Ok(value) => value,
        Err(error) => {
            tracing::warn!(tenant, key = name, %error, "encryption key unreadable");
            None
        }
    };
    loom_crypto::KeySecret {
        name: name.to_owned(),
        origin,
        value,
    }
}

#[cfg(all(test, not(feature = "crypto")))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use loom_config::{Config, EncryptionStorage, EventsBackend, LoomConfig};

    /// A build without the `crypto` feature refuses `storage.encryption` when the configuration
    /// is opened, naming the feature, rather than writing clear what was asked sealed.
    #[test]
    fn encryption_without_the_feature_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut raw = LoomConfig::default();
        raw.storage.events.backend = EventsBackend::Jsonl;
        raw.storage.events.path = Some("journal".into());
        raw.storage.encryption = Some(EncryptionStorage {
            keys: vec!["JOURNAL_KEY".into()],
        });
        let config = Config::new(raw, dir.path().to_path_buf()).unwrap();
        let error = crate::Loom::new(config).unwrap_err().to_string();
        assert!(
            error.contains("storage.encryption: encryption needs the `crypto` feature of loom-ia"),
            "{error}"
        );
    }
}
