//! [`PgArtifacts`]: the files of sessions in `loom_artifacts`, content-addressed like every
//! artifact store (`artifact://<tenant>/<session>/<sha256>.<ext>`).
//!
//! They are in the database, not in a directory, because several workers on several hosts
//! share the database but no directory; and a tenant's files then fall under the same
//! row-level security, retention and erasure as its journal.

use loom_core::{
    BoxFuture,
    ids::is_safe_id,
    ports::{ArtifactStore, StoreError, artifact_uri, check_artifact_address, check_content_hash},
};
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::PgDatabase;

/// An [`ArtifactStore`] in a PostgreSQL database. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PgArtifacts {
    db: PgDatabase,
}

/// The tenant of `artifact://<tenant>/<session>/<sha256>.<ext>`, when the URI is well-formed.
fn tenant_of(uri: &str) -> Option<&str> {
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
    ok.then_some(tenant)
}

impl PgArtifacts {
    /// The artifacts of `db`.
    pub fn new(db: PgDatabase) -> PgArtifacts {
        PgArtifacts { db }
    }

    /// Stores `bytes` at the address `hash` (the sha256 of the clear bytes: of `bytes` for
    /// `put`, of what the sealing store sealed for `put_at`). A file already stored at that
    /// address is kept as it is: the same clear bytes.
    async fn put_now(
        &self,
        tenant_id: &str,
        session_id: &str,
        hash: &str,
        bytes: Vec<u8>,
        extension: &str,
    ) -> Result<String, StoreError> {
        check_artifact_address(tenant_id, session_id, extension)?;
        check_content_hash(hash)?;
        let uri = artifact_uri(tenant_id, session_id, hash, extension);
        let mut tx = self.db.begin(tenant_id).await?;
        let done = sqlx::query(
            "INSERT INTO loom_artifacts (tenant_id, session_id, uri, bytes) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (tenant_id, uri) DO NOTHING",
        )
        .bind(tenant_id)
        .bind(session_id)
        .bind(&uri)
        .bind(bytes)
        .execute(&mut *tx)
        .await
        .map(|_| ())
        .map_err(|err| self.db.error(err));
        self.db.finish(tx, done).await.map(|()| uri)
    }

    async fn get_now(&self, uri: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(tenant_id) = tenant_of(uri) else {
            return Ok(None);
        };
        let mut tx = self.db.begin(tenant_id).await?;
        let row = sqlx::query("SELECT bytes FROM loom_artifacts WHERE tenant_id = $1 AND uri = $2")
            .bind(tenant_id)
            .bind(uri)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|err| self.db.error(err));
        let row = self.db.finish(tx, row).await?;
        row.map(|row| row.try_get::<Vec<u8>, _>(0))
            .transpose()
            .map_err(|err| self.db.error(err))
    }

    async fn delete_session_now(
        &self,
        tenant_id: &str,
        session_id: &str,
    ) -> Result<u64, StoreError> {
        check_artifact_address(tenant_id, session_id, "bin")?;
        let mut tx = self.db.begin(tenant_id).await?;
        let done =
            sqlx::query("DELETE FROM loom_artifacts WHERE tenant_id = $1 AND session_id = $2")
                .bind(tenant_id)
                .bind(session_id)
                .execute(&mut *tx)
                .await
                .map(|done| done.rows_affected())
                .map_err(|err| self.db.error(err));
        self.db.finish(tx, done).await
    }
}

impl ArtifactStore for PgArtifacts {
    fn put<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        bytes: Vec<u8>,
        extension: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        Box::pin(async move {
            let hash = hex::encode(Sha256::digest(&bytes));
            self.put_now(tenant_id, session_id, &hash, bytes, extension)
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
        Box::pin(self.put_now(tenant_id, session_id, sha256_hex, bytes, extension))
    }

    fn get<'a>(&'a self, uri: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
        Box::pin(self.get_now(uri))
    }

    fn delete_session<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.delete_session_now(tenant_id, session_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_uris_name_a_tenant() {
        let hash = "a".repeat(64);
        assert_eq!(
            tenant_of(&format!("artifact://t1/s/{hash}.txt")),
            Some("t1")
        );
        for bad in [
            format!("artifact://t1/s/{}.txt", "a".repeat(63)),
            format!("artifact://../s/{hash}.txt"),
            format!("file://t1/s/{hash}.txt"),
            format!("artifact://t1/s/{hash}"),
        ] {
            assert_eq!(tenant_of(&bad), None, "{bad}");
        }
    }
}
