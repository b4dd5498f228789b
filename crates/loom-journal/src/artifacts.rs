//! Artifact stores: files kept beside the journal, content-addressed.
//!
//! - [`LocalArtifacts`]: one file per artifact under `<root>/<tenant>/<session>/<sha256>.<ext>`,
//!   written to a temporary name, fsynced, then renamed, so a reader never sees half a file.
//! - [`MemoryArtifacts`]: in-process, for the memory journal.
//!
//! The URI is `artifact://<tenant>/<session>/<sha256>.<ext>`: storing the same bytes twice gives
//! the same URI and writes nothing new. `put_at` stores bytes at an address the caller computed
//! (the sealing store of `loom-crypto` keeps sealed bytes at their clear bytes' address).

use std::{
    collections::HashMap,
    io::Write,
    path::{Path, PathBuf},
    sync::Mutex,
};

use loom_core::{
    BoxFuture,
    ids::is_safe_id,
    ports::{ArtifactStore, StoreError, artifact_uri, check_artifact_address, check_content_hash},
};
use sha2::{Digest, Sha256};

/// Artifacts in a directory.
#[derive(Debug, Clone)]
pub struct LocalArtifacts {
    root: PathBuf,
}

impl LocalArtifacts {
    /// Artifacts under `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> LocalArtifacts {
        LocalArtifacts { root: root.into() }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

/// Artifacts in memory.
#[derive(Debug, Default)]
pub struct MemoryArtifacts {
    files: Mutex<HashMap<String, Vec<u8>>>,
}

impl MemoryArtifacts {
    /// An empty store.
    pub fn new() -> MemoryArtifacts {
        MemoryArtifacts::default()
    }
}

fn hex_sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `artifact://t/s/h.ext` → `(t, s, "h.ext")`, checked.
fn parse(uri: &str) -> Option<(&str, &str, &str)> {
    let rest = uri.strip_prefix("artifact://")?;
    let mut parts = rest.splitn(3, '/');
    let (tenant, session, file) = (parts.next()?, parts.next()?, parts.next()?);
    let (hash, ext) = file.split_once('.')?;
    let ok = is_safe_id(tenant)
        && is_safe_id(session)
        && hash.len() == 64
        && hash.bytes().all(|b| b.is_ascii_hexdigit())
        && !ext.is_empty()
        && ext.bytes().all(|b| b.is_ascii_alphanumeric());
    ok.then_some((tenant, session, file))
}

impl ArtifactStore for LocalArtifacts {
    fn delete_session<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            check_artifact_address(tenant_id, session_id, "bin")?;
            let dir = self.root.join(tenant_id).join(session_id);
            tokio::task::spawn_blocking(move || {
                let count = match std::fs::read_dir(&dir) {
                    Ok(entries) => entries.count() as u64,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
                    Err(e) => {
                        return Err(StoreError::Io {
                            path: dir.display().to_string(),
                            source: e,
                        });
                    }
                };
                std::fs::remove_dir_all(&dir).map_err(|e| StoreError::Io {
                    path: dir.display().to_string(),
                    source: e,
                })?;
                Ok(count)
            })
            .await
            .map_err(|e| StoreError::Io {
                path: "artifacts".into(),
                source: std::io::Error::other(e),
            })?
        })
    }

    fn put<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        bytes: Vec<u8>,
        extension: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        Box::pin(async move {
            let hash = hex_sha256(&bytes);
            self.put_at(tenant_id, session_id, &hash, bytes, extension)
                .await
        })
    }

    fn put_at<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        sha256_hex: &'a str,
        bytes: Vec<u8>,
        extension: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        Box::pin(async move {
            check_artifact_address(tenant_id, session_id, extension)?;
            check_content_hash(sha256_hex)?;
            let dir = self.root.join(tenant_id).join(session_id);
            let path = dir.join(format!("{sha256_hex}.{extension}"));
            let uri = artifact_uri(tenant_id, session_id, sha256_hex, extension);
            tokio::task::spawn_blocking(move || write_atomically(&dir, &path, &bytes))
                .await
                .map_err(|e| StoreError::Io {
                    path: "artifacts".into(),
                    source: std::io::Error::other(e),
                })??;
            Ok(uri)
        })
    }

    fn get<'a>(&'a self, uri: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
        Box::pin(async move {
            let Some((tenant, session, file)) = parse(uri) else {
                return Ok(None);
            };
            let path = self.root.join(tenant).join(session).join(file);
            match tokio::task::spawn_blocking(move || std::fs::read(&path).map_err(|e| (path, e)))
                .await
            {
                Ok(Ok(bytes)) => Ok(Some(bytes)),
                Ok(Err((_, e))) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Ok(Err((path, e))) => Err(StoreError::Io {
                    path: path.display().to_string(),
                    source: e,
                }),
                Err(e) => Err(StoreError::Io {
                    path: uri.to_owned(),
                    source: std::io::Error::other(e),
                }),
            }
        })
    }
}

fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let io = |source, path: &Path| StoreError::Io {
        path: path.display().to_string(),
        source,
    };
    if path.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| io(e, dir))?;
    let temporary = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut file = std::fs::File::create(&temporary).map_err(|e| io(e, &temporary))?;
    file.write_all(bytes).map_err(|e| io(e, &temporary))?;
    file.sync_data().map_err(|e| io(e, &temporary))?;
    std::fs::rename(&temporary, path).map_err(|e| io(e, path))?;
    if let Ok(directory) = std::fs::File::open(dir) {
        let _ = directory.sync_all();
    }
    Ok(())
}

impl ArtifactStore for MemoryArtifacts {
    fn delete_session<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let prefix = format!("artifact://{tenant_id}/{session_id}/");
            let mut files = self
                .files
                .lock()
                .map_err(|_| StoreError::Invalid("artifact store lock poisoned".into()))?;
            let before = files.len();
            files.retain(|uri, _| !uri.starts_with(&prefix));
            Ok((before - files.len()) as u64)
        })
    }

    fn put<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        bytes: Vec<u8>,
        extension: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        Box::pin(async move {
            let hash = hex_sha256(&bytes);
            self.put_at(tenant_id, session_id, &hash, bytes, extension)
                .await
        })
    }

    fn put_at<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        sha256_hex: &'a str,
        bytes: Vec<u8>,
        extension: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        Box::pin(async move {
            check_artifact_address(tenant_id, session_id, extension)?;
            check_content_hash(sha256_hex)?;
            let uri = artifact_uri(tenant_id, session_id, sha256_hex, extension);
            let mut files = self
                .files
                .lock()
                .map_err(|_| StoreError::Invalid("artifact store lock poisoned".into()))?;
            files.entry(uri.clone()).or_insert(bytes);
            Ok(uri)
        })
    }

    fn get<'a>(&'a self, uri: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
        Box::pin(async move {
            let files = self
                .files
                .lock()
                .map_err(|_| StoreError::Invalid("artifact store lock poisoned".into()))?;
            Ok(files.get(uri).cloned())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn round_trip(store: &dyn ArtifactStore) {
        let uri = store
            .put("default", "s1", b"hello".to_vec(), "txt")
            .await
            .unwrap();
        assert_eq!(
            uri,
            "artifact://default/s1/2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824.txt"
        );
        assert_eq!(
            store
                .put("default", "s1", b"hello".to_vec(), "txt")
                .await
                .unwrap(),
            uri
        );
        assert_eq!(
            store.get(&uri).await.unwrap().as_deref(),
            Some(&b"hello"[..])
        );
        assert_eq!(
            store
                .get("artifact://default/s1/../../etc/passwd")
                .await
                .unwrap(),
            None
        );
        assert!(store.put("default", "../x", vec![], "txt").await.is_err());
    }

    #[tokio::test]
    async fn local_and_memory_stores_agree() {
        let dir = tempfile::tempdir().unwrap();
        round_trip(&LocalArtifacts::new(dir.path())).await;
        round_trip(&MemoryArtifacts::new()).await;
    }
}
