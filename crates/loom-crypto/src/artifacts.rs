//! [`SealedArtifacts`]: any [`ArtifactStore`] with its files sealed at rest.
//!
//! A file is stored as `b"LOOMSEAL1" ‖ key_id ‖ nonce ‖ ciphertext ‖ tag` with the tenant's
//! first key, its AAD the artifact URI; the URI stays the content address of the clear bytes
//! (`ArtifactStore::put_at`), so a file journaled before sealing and after has the same name, and
//! sealing cannot be used to tell two files apart. A clear file (stored before sealing began) is
//! read as it is.

use std::sync::Arc;

use loom_core::{
    BoxFuture,
    ports::{ArtifactStore, StoreError, artifact_uri},
};
use sha2::{Digest, Sha256};

use crate::{
    keys::{KeySource, Keyring},
    seal::{file_key_id, open_file, seal_file},
};

/// An artifact store whose files are sealed with each tenant's key (see the module). Without
/// keys for a tenant its files are stored clear, and a sealed file is a
/// [`StoreError::MissingKey`].
#[derive(Debug, Clone)]
pub struct SealedArtifacts {
    inner: Arc<dyn ArtifactStore>,
    keys: Arc<dyn KeySource>,
}

impl SealedArtifacts {
    /// `inner`, sealed with the keys `keys` gives for each tenant.
    pub fn new(inner: Arc<dyn ArtifactStore>, keys: Arc<dyn KeySource>) -> SealedArtifacts {
        SealedArtifacts { inner, keys }
    }
}

/// The tenant an artifact URI names (`artifact://<tenant>/…`).
fn tenant_of(uri: &str) -> Option<&str> {
    uri.strip_prefix("artifact://")?.split('/').next()
}

impl SealedArtifacts {
    /// Stores `bytes`, whose clear content address is `hash`, sealed with the tenant's first
    /// key under their URI; stored as given when the tenant has no keys.
    async fn put_sealed(
        &self,
        tenant_id: &str,
        session_id: &str,
        hash: &str,
        bytes: Vec<u8>,
        extension: &str,
    ) -> Result<String, StoreError> {
        let keyring = Keyring::of(self.keys.as_ref(), tenant_id);
        if !keyring.seals() {
            return self
                .inner
                .put_at(tenant_id, session_id, hash, bytes, extension)
                .await;
        }
        let uri = artifact_uri(tenant_id, session_id, hash, extension);
        let key = keyring.sealing(&format!("file {uri}"))?;
        let sealed = seal_file(key, &uri, &bytes).map_err(|error| StoreError::Unsealable {
            tenant_id: tenant_id.to_owned(),
            what: format!("file {uri}"),
            reason: error.to_string(),
        })?;
        self.inner
            .put_at(tenant_id, session_id, hash, sealed, extension)
            .await
    }
}

impl ArtifactStore for SealedArtifacts {
    fn put<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        bytes: Vec<u8>,
        extension: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        Box::pin(async move {
            let keyring = Keyring::of(self.keys.as_ref(), tenant_id);
            if !keyring.seals() {
                return self
                    .inner
                    .put(tenant_id, session_id, bytes, extension)
                    .await;
            }
            let hash = hex::encode(Sha256::digest(&bytes));
            self.put_sealed(tenant_id, session_id, &hash, bytes, extension)
                .await
        })
    }

    /// `bytes` are the clear bytes whose address the caller computed: sealed like `put`'s,
    /// never stored clear when the tenant has keys.
    fn put_at<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        sha256_hex: &'a str,
        bytes: Vec<u8>,
        extension: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        Box::pin(self.put_sealed(tenant_id, session_id, sha256_hex, bytes, extension))
    }

    fn get<'a>(&'a self, uri: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
        Box::pin(async move {
            let Some(bytes) = self.inner.get(uri).await? else {
                return Ok(None);
            };
            let tenant = tenant_of(uri).unwrap_or_default();
            let unsealable = |reason: String| StoreError::Unsealable {
                tenant_id: tenant.to_owned(),
                what: format!("file {uri}"),
                reason,
            };
            let key_id = match file_key_id(&bytes) {
                None => return Ok(Some(bytes)),
                Some(Ok(key_id)) => key_id,
                Some(Err(error)) => return Err(unsealable(error.to_string())),
            };
            let keyring = Keyring::of(self.keys.as_ref(), tenant);
            let key = keyring.opening(key_id)?;
            open_file(key, uri, &bytes)
                .map(Some)
                .map_err(|error| unsealable(error.to_string()))
        })
    }

    fn delete_session<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.delete_session(tenant_id, session_id)
    }
}
