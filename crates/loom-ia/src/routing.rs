//! Tenants with a journal of their own (`tenants[].storage`): a journal and an artifact store
//! that send each tenant to its own store, and every other tenant to the root one.
//!
//! Every method of the ports names its tenant (`append`'s batch is of one tenant, an artifact's
//! URI starts with it), so routing is a lookup; nothing is read or written in a store that is not
//! the tenant's.

use std::{collections::BTreeMap, sync::Arc};

use loom_core::{
    BoxFuture, Event,
    ports::{ArtifactStore, EventStore, Salvage, SessionSummary, SetAside, StoreError},
};

/// A store per tenant that declares one, the root store for the others: the journals
/// ([`RoutedEvents`]) and the artifact stores ([`RoutedArtifacts`]).
#[derive(Debug)]
pub(crate) struct Routed<S: ?Sized> {
    root: Arc<S>,
    tenants: BTreeMap<String, Arc<S>>,
}

impl<S: ?Sized> Routed<S> {
    /// Routes the tenants of `tenants` to their stores, the others to `root`.
    pub(crate) fn new(root: Arc<S>, tenants: BTreeMap<String, Arc<S>>) -> Routed<S> {
        Routed { root, tenants }
    }

    fn of(&self, tenant: &str) -> &Arc<S> {
        self.tenants.get(tenant).unwrap_or(&self.root)
    }
}

/// A journal per tenant that declares one, the root journal for the others.
pub(crate) type RoutedEvents = Routed<dyn EventStore>;

/// An artifact store per tenant that declares one, the root store for the others.
pub(crate) type RoutedArtifacts = Routed<dyn ArtifactStore>;

impl EventStore for RoutedEvents {
    fn append(
        &self,
        batch: Vec<Event>,
        expected_last_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
        // A batch is of one tenant and session (the stores check it); an empty one goes to the
        // root store, which refuses or ignores it as it always did.
        let store = match batch.first() {
            Some(first) => self.of(&first.tenant_id).clone(),
            None => self.root.clone(),
        };
        Box::pin(async move { store.append(batch, expected_last_seq).await })
    }

    fn append_shared<'a>(
        &'a self,
        batch: &'a [std::sync::Arc<Event>],
        expected_last_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<std::sync::Arc<Event>>, StoreError>> {
        let store = match batch.first() {
            Some(first) => self.of(&first.tenant_id),
            None => &self.root,
        };
        store.append_shared(batch, expected_last_seq)
    }

    fn read_shared<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<std::sync::Arc<Event>>, StoreError>> {
        self.of(tenant_id)
            .read_shared(tenant_id, session_id, after_seq)
    }

    fn last_of_type_shared<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<std::sync::Arc<Event>>, StoreError>> {
        self.of(tenant_id)
            .last_of_type_shared(tenant_id, session_id, event_type, before_seq)
    }

    fn read<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        self.of(tenant_id).read(tenant_id, session_id, after_seq)
    }

    fn last_seq<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.of(tenant_id).last_seq(tenant_id, session_id)
    }

    fn sessions<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SessionSummary>, StoreError>> {
        self.of(tenant_id).sessions(tenant_id)
    }

    fn delete<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.of(tenant_id).delete(tenant_id, session_id)
    }

    fn find_run<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        self.of(tenant_id).find_run(tenant_id, run_id)
    }

    fn salvage<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Salvage, StoreError>> {
        self.of(tenant_id).salvage(tenant_id, session_id)
    }

    fn set_aside<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        lines: Vec<SetAside>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.of(tenant_id).set_aside(tenant_id, session_id, lines)
    }

    fn search<'a>(
        &'a self,
        filter: &'a loom_core::search::EventFilter,
    ) -> BoxFuture<'a, Result<Option<loom_core::search::Searched>, StoreError>> {
        self.of(&filter.tenant_id).search(filter)
    }

    fn recent_sessions<'a>(
        &'a self,
        tenant_id: &'a str,
        since: Option<chrono::DateTime<chrono::Utc>>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Option<loom_core::search::RecentSessions>, StoreError>> {
        self.of(tenant_id).recent_sessions(tenant_id, since, limit)
    }

    fn run_start<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        self.of(tenant_id).run_start(tenant_id, session_id, run_id)
    }

    fn last_of_type<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Event>, StoreError>> {
        self.of(tenant_id)
            .last_of_type(tenant_id, session_id, event_type, before_seq)
    }
}

impl ArtifactStore for RoutedArtifacts {
    fn put<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        bytes: Vec<u8>,
        extension: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        self.of(tenant_id)
            .put(tenant_id, session_id, bytes, extension)
    }

    fn get<'a>(&'a self, uri: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>> {
        // `artifact://<tenant>/<session>/<sha256>.<ext>`: a URI naming no tenant goes to the
        // root store, which answers as it always did.
        let tenant = uri
            .strip_prefix("artifact://")
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_default();
        self.of(tenant).get(uri)
    }

    fn delete_session<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.of(tenant_id).delete_session(tenant_id, session_id)
    }
}

/// The journal and artifact store of each tenant that declares its own storage.
pub(crate) type TenantStores = BTreeMap<String, (Arc<dyn EventStore>, Arc<dyn ArtifactStore>)>;

/// Opens the stores of every tenant that declares its own storage (a SQLite file is set up on
/// the calling thread: inside a tokio runtime, use [`tenant_stores_async`]).
pub(crate) fn tenant_stores(
    config: &loom_config::Config,
) -> Result<TenantStores, crate::LoomError> {
    let mut stores = TenantStores::new();
    for (index, tenant) in config.raw().tenants.iter().enumerate() {
        let Some(storage) = &tenant.storage else {
            continue;
        };
        let events: Arc<dyn EventStore> = match storage.events.backend {
            loom_config::EventsBackend::Sqlite => sqlite(config, index, &tenant.id)?,
            _ => plain(config, index, &tenant.id)?,
        };
        stores.insert(tenant.id.clone(), (events, artifacts(config, &tenant.id)));
    }
    Ok(stores)
}

/// [`tenant_stores`] inside a tokio runtime: SQLite files are set up without blocking a worker
/// thread.
pub(crate) async fn tenant_stores_async(
    config: &loom_config::Config,
) -> Result<TenantStores, crate::LoomError> {
    let mut stores = TenantStores::new();
    for (index, tenant) in config.raw().tenants.iter().enumerate() {
        let Some(storage) = &tenant.storage else {
            continue;
        };
        let events: Arc<dyn EventStore> = match storage.events.backend {
            loom_config::EventsBackend::Sqlite => sqlite_async(config, index, &tenant.id).await?,
            _ => plain(config, index, &tenant.id)?,
        };
        stores.insert(tenant.id.clone(), (events, artifacts(config, &tenant.id)));
    }
    Ok(stores)
}

/// A tenant's memory or JSONL journal.
fn plain(
    config: &loom_config::Config,
    index: usize,
    tenant: &str,
) -> Result<Arc<dyn EventStore>, crate::LoomError> {
    match config.tenant_events_path(tenant) {
        Some(path) => Ok(Arc::new(loom_journal::JsonlStore::new(path))),
        None if backend(config, tenant) == Some(loom_config::EventsBackend::Memory) => {
            Ok(Arc::new(loom_journal::MemoryStore::new()))
        }
        None => Err(config
            .error_at_root(
                &format!("tenants[{index}].storage.events.path"),
                "the tenant's journal needs a path",
            )
            .into()),
    }
}

fn backend(config: &loom_config::Config, tenant: &str) -> Option<loom_config::EventsBackend> {
    Some(config.tenant(tenant)?.storage.as_ref()?.events.backend)
}

/// A tenant's artifacts: in its directory, or in memory.
fn artifacts(config: &loom_config::Config, tenant: &str) -> Arc<dyn ArtifactStore> {
    match config.tenant_artifacts_path(tenant) {
        Some(path) => Arc::new(loom_journal::LocalArtifacts::new(path)),
        None => Arc::new(loom_journal::MemoryArtifacts::new()),
    }
}

#[cfg(feature = "sqlite")]
fn sqlite(
    config: &loom_config::Config,
    index: usize,
    tenant: &str,
) -> Result<Arc<dyn EventStore>, crate::LoomError> {
    match config.tenant_events_path(tenant) {
        Some(path) => Ok(Arc::new(loom_sqlite::SqliteStore::open(path)?)),
        None => plain(config, index, tenant),
    }
}

#[cfg(feature = "sqlite")]
async fn sqlite_async(
    config: &loom_config::Config,
    index: usize,
    tenant: &str,
) -> Result<Arc<dyn EventStore>, crate::LoomError> {
    match config.tenant_events_path(tenant) {
        Some(path) => Ok(Arc::new(loom_sqlite::SqliteStore::connect(path).await?)),
        None => plain(config, index, tenant),
    }
}

/// Without the `sqlite` feature, a tenant's `sqlite` journal is a configuration error.
#[cfg(not(feature = "sqlite"))]
fn sqlite(
    config: &loom_config::Config,
    index: usize,
    _tenant: &str,
) -> Result<Arc<dyn EventStore>, crate::LoomError> {
    Err(config
        .error_at_root(
            &format!("tenants[{index}].storage.events.backend"),
            "backend 'sqlite' needs the `sqlite` feature of loom-ia, which this build lacks \
             (loom-cli enables it by default)",
        )
        .into())
}

/// Without the `sqlite` feature, a tenant's `sqlite` journal is a configuration error.
#[cfg(not(feature = "sqlite"))]
async fn sqlite_async(
    config: &loom_config::Config,
    index: usize,
    tenant: &str,
) -> Result<Arc<dyn EventStore>, crate::LoomError> {
    sqlite(config, index, tenant)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use loom_journal::MemoryArtifacts;

    /// Files go to the store of the tenant their URI names; a URI naming no declared tenant
    /// (or no tenant at all) is the root store's.
    #[tokio::test]
    async fn an_artifact_is_put_read_and_erased_in_its_tenants_store() {
        let root: Arc<dyn ArtifactStore> = Arc::new(MemoryArtifacts::new());
        let acme: Arc<dyn ArtifactStore> = Arc::new(MemoryArtifacts::new());
        let routed = RoutedArtifacts::new(root.clone(), [("acme".to_owned(), acme.clone())].into());
        let own = routed
            .put("acme", "s1", b"acme".to_vec(), "txt")
            .await
            .unwrap();
        let other = routed
            .put("dupont", "s1", b"dupont".to_vec(), "txt")
            .await
            .unwrap();
        assert_eq!(acme.get(&own).await.unwrap(), Some(b"acme".to_vec()));
        assert_eq!(root.get(&own).await.unwrap(), None);
        assert_eq!(root.get(&other).await.unwrap(), Some(b"dupont".to_vec()));
        assert_eq!(routed.get(&own).await.unwrap(), Some(b"acme".to_vec()));
        assert_eq!(routed.get("not a uri").await.unwrap(), None);
        assert_eq!(routed.delete_session("acme", "s1").await.unwrap(), 1);
        assert_eq!(routed.get(&other).await.unwrap(), Some(b"dupont".to_vec()));
    }

    /// A journal that answers the pushed-down reads with its own name, or, with no name (a
    /// journal with no index), answers none of them.
    #[derive(Debug)]
    struct Answering(Option<&'static str>);

    impl EventStore for Answering {
        fn append(
            &self,
            batch: Vec<Event>,
            _: u64,
        ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
            Box::pin(async move { Ok(batch) })
        }
        fn read<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
            _: u64,
        ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn last_seq<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<u64, StoreError>> {
            Box::pin(async { Ok(0) })
        }
        fn sessions<'a>(
            &'a self,
            _: &'a str,
        ) -> BoxFuture<'a, Result<Vec<SessionSummary>, StoreError>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn delete<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
            Box::pin(async { Ok(0) })
        }
        fn search<'a>(
            &'a self,
            _: &'a loom_core::search::EventFilter,
        ) -> BoxFuture<'a, Result<Option<loom_core::search::Searched>, StoreError>> {
            let answers = self.0.is_some();
            Box::pin(
                async move { Ok(answers.then_some(loom_core::search::Searched::UnknownAfter)) },
            )
        }
        fn recent_sessions<'a>(
            &'a self,
            _: &'a str,
            _: Option<chrono::DateTime<chrono::Utc>>,
            _: usize,
        ) -> BoxFuture<'a, Result<Option<loom_core::search::RecentSessions>, StoreError>> {
            let name = self.0;
            Box::pin(async move {
                Ok(name.map(|name| loom_core::search::RecentSessions {
                    sessions: vec![SessionSummary {
                        session_id: name.to_owned(),
                        last_seq: 1,
                        updated_at: None,
                    }],
                    more: false,
                }))
            })
        }
    }

    /// The reads a store may answer from its indexes go to the tenant's store: a tenant with a
    /// journal of its own (here one that cannot answer) is never answered by the root's.
    #[tokio::test]
    async fn pushed_down_reads_go_to_the_tenants_store() {
        let own: Arc<dyn EventStore> = Arc::new(Answering(None));
        let routed = RoutedEvents::new(
            Arc::new(Answering(Some("root"))),
            [("acme".to_owned(), own)].into(),
        );
        let recent = routed
            .recent_sessions("dupont", None, 5)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(recent.sessions[0].session_id, "root");
        assert_eq!(routed.recent_sessions("acme", None, 5).await.unwrap(), None);
        let filter = |tenant: &str| loom_core::search::EventFilter {
            tenant_id: tenant.to_owned(),
            limit: 10,
            ..Default::default()
        };
        assert!(routed.search(&filter("dupont")).await.unwrap().is_some());
        assert_eq!(routed.search(&filter("acme")).await.unwrap(), None);
    }
}
