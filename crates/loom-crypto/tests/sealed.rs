//! The sealing stores over real backends: the journal conformance suite through the sealing
//! wrapper (JSONL, SQLite, PostgreSQL, memory), what reaches the disk, rotation, missing and
//! wrong keys, altered lines, clear lines from before sealing, and sealed files.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use base64::{Engine as _, engine::general_purpose::STANDARD};
use loom_core::{
    Payload,
    ports::{ArtifactStore, EventStore, StoreError},
};
use loom_crypto::{KeySecret, KeySource, SealedArtifacts, SealedJournal, seal::Key};
use loom_journal::{JsonlStore, LocalArtifacts, MemoryStore};
use loom_testkit::conformance::{event, started};
use serde_json::{Map, Value, json};

/// Keys set by the test, the same for every tenant but `other` (which has none).
#[derive(Debug, Default)]
struct TestKeys(Mutex<Vec<(String, Option<String>)>>);

impl TestKeys {
    fn with(keys: &[(&str, Option<&str>)]) -> Arc<TestKeys> {
        let source = TestKeys::default();
        source.set(keys_of(keys));
        Arc::new(source)
    }

    fn set(&self, keys: Vec<(String, Option<String>)>) {
        *self.0.lock().unwrap() = keys;
    }
}

fn keys_of(keys: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
    keys.iter()
        .map(|(name, value)| ((*name).to_owned(), value.map(str::to_owned)))
        .collect()
}

impl KeySource for TestKeys {
    fn keys(&self, tenant_id: &str) -> Vec<KeySecret> {
        if tenant_id == "other" {
            return Vec::new();
        }
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(name, value)| KeySecret {
                name: name.clone(),
                origin: format!("variable {}", name.to_uppercase()),
                value: value.clone(),
            })
            .collect()
    }
}

const KEY_A: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

fn key_b() -> String {
    STANDARD.encode([9u8; 32])
}

fn id_of(value: &str) -> String {
    Key::from_base64(value).unwrap().id().to_owned()
}

fn sealed_jsonl(
    dir: &std::path::Path,
    keys: Arc<TestKeys>,
) -> (SealedJournal, Arc<dyn EventStore>) {
    let inner: Arc<dyn EventStore> = Arc::new(JsonlStore::new(dir));
    (SealedJournal::new(inner.clone(), keys), inner)
}

fn secret_metadata(text: &str) -> Map<String, Value> {
    let mut metadata = Map::new();
    metadata.insert("note".into(), json!(text));
    metadata
}

// The journal contract holds through the sealing wrapper, on every backend.

loom_testkit::store_conformance!(sealed_memory, {
    let inner: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let store: Arc<dyn EventStore> = Arc::new(SealedJournal::new(
        inner,
        TestKeys::with(&[("journal_key", Some(KEY_A))]),
    ));
    ((), move || store.clone())
});

loom_testkit::store_conformance!(sealed_jsonl, {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let keys = TestKeys::with(&[("journal_key", Some(KEY_A))]);
    (dir, move || {
        Arc::new(SealedJournal::new(
            Arc::new(JsonlStore::new(&root)),
            keys.clone(),
        )) as Arc<dyn EventStore>
    })
});

loom_testkit::store_conformance!(sealed_sqlite, {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loom.db");
    let inner: Arc<dyn EventStore> = Arc::new(loom_sqlite::SqliteStore::open(&path).unwrap());
    let keys = TestKeys::with(&[("journal_key", Some(KEY_A))]);
    let store: Arc<dyn EventStore> = Arc::new(SealedJournal::new(inner, keys));
    (dir, move || store.clone())
});

/// A fresh PostgreSQL database with Loom's schema (`None`: skipped without `LOOM_TEST_POSTGRES`).
async fn postgres(
    test: &str,
) -> Option<(loom_testkit::postgres::TestDb, loom_postgres::PgDatabase)> {
    let db = loom_testkit::postgres::TestDb::create(test)?;
    let handle = loom_postgres::PgDatabase::new(&loom_postgres::PgOptions {
        dsn: db.url(),
        role: db.role().to_owned(),
        pool: loom_postgres::PoolSettings {
            min_size: 1,
            max_size: 4,
            ..loom_postgres::PoolSettings::default()
        },
    })
    .unwrap();
    handle.migrate().await.unwrap();
    Some((db, handle))
}

loom_testkit::store_conformance!(sealed_postgres, {
    let Some((db, handle)) = postgres("sealed_postgres").await else {
        return;
    };
    let inner: Arc<dyn EventStore> = Arc::new(loom_postgres::PgStore::new(handle));
    let keys = TestKeys::with(&[("journal_key", Some(KEY_A))]);
    let store: Arc<dyn EventStore> = Arc::new(SealedJournal::new(inner, keys));
    (db, move || store.clone())
});

/// On PostgreSQL the row holds the sealed line, the search pushed down to SQL hands back the
/// clear event through the wrapper.
#[tokio::test]
async fn a_postgres_row_holds_no_clear_payload() {
    let Some((db, handle)) = postgres("a_postgres_row_holds_no_clear_payload").await else {
        return;
    };
    let inner: Arc<dyn EventStore> = Arc::new(loom_postgres::PgStore::new(handle));
    let store = SealedJournal::new(inner, TestKeys::with(&[("journal_key", Some(KEY_A))]));
    let written = store
        .append(
            vec![started(
                "acme",
                "s-1",
                "r-1",
                secret_metadata("the secret answer is 42"),
            )],
            0,
        )
        .await
        .unwrap();
    let row = std::process::Command::new("psql")
        .args([
            db.url().as_str(),
            "-At",
            "-c",
            "SELECT event FROM loom_events",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&row.stdout).into_owned();
    assert!(
        row.status.success(),
        "{}",
        String::from_utf8_lossy(&row.stderr)
    );
    assert!(text.contains(r#""sealed":"#), "{text}");
    assert!(!text.contains("the secret answer"), "{text}");
    let filter = loom_core::search::EventFilter {
        tenant_id: "acme".into(),
        run_id: Some("r-1".into()),
        limit: 10,
        ..Default::default()
    };
    assert_eq!(
        store.search(&filter).await.unwrap(),
        Some(loom_core::search::Searched::Found(written))
    );
}

/// The file holds the envelope in clear and no payload text; the store underneath sees sealed
/// payloads naming the key, the wrapper hands back the clear events with their seqs.
#[tokio::test]
async fn the_journal_file_holds_no_clear_payload() {
    let dir = tempfile::tempdir().unwrap();
    let (store, inner) = sealed_jsonl(dir.path(), TestKeys::with(&[("journal_key", Some(KEY_A))]));
    let first = started(
        "acme",
        "s-1",
        "r-1",
        secret_metadata("the secret answer is 42"),
    );
    let written = store
        .append(vec![first.clone(), event("acme", "s-1", "a")], 0)
        .await
        .unwrap();
    assert_eq!(written[0].payload, first.payload);
    assert_eq!((written[0].seq, written[1].seq), (1, 2));

    let text = std::fs::read_to_string(dir.path().join("acme/s-1.jsonl")).unwrap();
    assert!(!text.contains("the secret answer"), "{text}");
    // Facets stay clear (`worker_id` of run.claimed), as the reference keeps them filterable.
    assert!(
        text.contains(r#""facets":{"worker_id":"worker-a"}"#),
        "{text}"
    );
    let line: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(line["type"], "run.started");
    assert_eq!(line["run_id"], "r-1");
    let payload = line["payload"].as_object().unwrap();
    assert_eq!(payload.keys().collect::<Vec<_>>(), ["sealed", "key_id"]);
    assert_eq!(payload["key_id"], id_of(KEY_A).as_str());

    let raw = inner.read("acme", "s-1", 0).await.unwrap();
    assert!(raw.iter().all(|e| matches!(e.payload, Payload::Sealed(_))));
    let read = store.read("acme", "s-1", 0).await.unwrap();
    assert_eq!(read, written);
    // The run index works on the clear envelope.
    assert_eq!(
        store.find_run("acme", "r-1").await.unwrap().as_deref(),
        Some("s-1")
    );
}

/// The first key seals, all open: old events stay readable after a new key is put first;
/// once the old key is removed, its events are a missing key naming the tenant and the id.
#[tokio::test]
async fn rotation_seals_with_the_first_key_and_opens_with_all() {
    let dir = tempfile::tempdir().unwrap();
    let keys = TestKeys::with(&[("old_key", Some(KEY_A))]);
    let (store, inner) = sealed_jsonl(dir.path(), keys.clone());
    store
        .append(vec![event("acme", "s-1", "a")], 0)
        .await
        .unwrap();

    let b = key_b();
    keys.set(keys_of(&[("new_key", Some(&b)), ("old_key", Some(KEY_A))]));
    store
        .append(vec![event("acme", "s-1", "b")], 1)
        .await
        .unwrap();
    let ids: Vec<String> = inner
        .read("acme", "s-1", 0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| match e.payload {
            Payload::Sealed(sealed) => sealed.key_id,
            other => panic!("clear payload {other:?}"),
        })
        .collect();
    assert_eq!(ids, [id_of(KEY_A), id_of(&b)]);
    assert_eq!(store.read("acme", "s-1", 0).await.unwrap().len(), 2);

    keys.set(keys_of(&[("new_key", Some(&b))]));
    assert_eq!(store.read("acme", "s-1", 1).await.unwrap().len(), 1);
    match store.read("acme", "s-1", 0).await.unwrap_err() {
        StoreError::MissingKey {
            tenant_id,
            key_id,
            reason,
        } => {
            assert_eq!((tenant_id.as_str(), key_id), ("acme", id_of(KEY_A)));
            assert!(
                reason.contains(&format!("'new_key' has id {}", id_of(&b))),
                "{reason}"
            );
        }
        other => panic!("{other}"),
    }
}

/// Crypto-shredding: with the variable gone, reading is a missing key and writing too (nothing
/// is written clear); the session can still be listed and erased. A wrong key is a missing
/// key naming the ids (a key id is its key's digest).
#[tokio::test]
async fn a_deleted_or_wrong_key_is_a_missing_key_and_the_session_can_still_be_erased() {
    let dir = tempfile::tempdir().unwrap();
    let keys = TestKeys::with(&[("journal_key", Some(KEY_A))]);
    let (store, _) = sealed_jsonl(dir.path(), keys.clone());
    store
        .append(vec![event("acme", "s-1", "a")], 0)
        .await
        .unwrap();

    keys.set(keys_of(&[("journal_key", None)]));
    let error = store.read("acme", "s-1", 0).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "sealed journal: tenant 'acme' has no key {}: none of its keys opens it \
             ('journal_key' is not set (variable JOURNAL_KEY)); a deleted key cannot be recovered",
            id_of(KEY_A)
        )
    );
    let refused = store
        .append(vec![event("acme", "s-1", "b")], 1)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, StoreError::MissingKey { .. }),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("nothing is written"),
        "{refused}"
    );

    let b = key_b();
    keys.set(keys_of(&[("journal_key", Some(&b))]));
    assert!(matches!(
        store.read("acme", "s-1", 0).await.unwrap_err(),
        StoreError::MissingKey { .. }
    ));

    keys.set(keys_of(&[("journal_key", Some("c2hvcnQ="))]));
    let bad = store
        .append(vec![event("acme", "s-1", "b")], 1)
        .await
        .unwrap_err();
    assert!(matches!(bad, StoreError::Unsealable { .. }), "{bad}");
    assert!(bad.to_string().contains("found 5 bytes"), "{bad}");

    assert_eq!(store.sessions("acme").await.unwrap().len(), 1);
    assert_eq!(store.last_seq("acme", "s-1").await.unwrap(), 1);
    assert_eq!(store.delete("acme", "s-1").await.unwrap(), 1);
    assert!(store.sessions("acme").await.unwrap().is_empty());
}

/// An altered ciphertext, or a sealed payload moved to another line (its seq, its envelope),
/// cannot be opened: a clear error, never garbage.
#[tokio::test]
async fn an_altered_or_moved_line_cannot_be_opened() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = sealed_jsonl(dir.path(), TestKeys::with(&[("journal_key", Some(KEY_A))]));
    store
        .append(
            vec![event("acme", "s-1", "a"), event("acme", "s-1", "b")],
            0,
        )
        .await
        .unwrap();
    let path = dir.path().join("acme/s-1.jsonl");
    let original = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<Value> = original
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();

    // The second line's payload in the first line's place.
    let mut moved = lines.clone();
    moved[0]["payload"] = lines[1]["payload"].clone();
    write_lines(&path, &moved);
    let error = store.read("acme", "s-1", 0).await.unwrap_err();
    assert!(matches!(error, StoreError::Unsealable { .. }), "{error}");
    assert!(error.to_string().contains("cannot open event"), "{error}");

    // One character of the ciphertext changed.
    let mut altered = lines.clone();
    let sealed = altered[1]["payload"]["sealed"].as_str().unwrap().to_owned();
    let mut bytes = STANDARD.decode(&sealed).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    altered[1]["payload"]["sealed"] = json!(STANDARD.encode(bytes));
    write_lines(&path, &altered);
    let error = store.read("acme", "s-1", 0).await.unwrap_err();
    assert!(
        error.to_string().contains("the key does not open it"),
        "{error}"
    );

    // The envelope's type changed: it no longer matches the opened payload.
    let mut retyped = lines.clone();
    retyped[0]["facets"] = json!({"changed": true});
    write_lines(&path, &retyped);
    let error = store.read("acme", "s-1", 0).await.unwrap_err();
    assert!(
        error.to_string().contains("does not match its payload"),
        "{error}"
    );
}

fn write_lines(path: &std::path::Path, lines: &[Value]) {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, text).unwrap();
}

/// A journal begun clear and sealed afterwards reads whole; a tenant without keys writes clear
/// and cannot read a sealed line.
#[tokio::test]
async fn clear_lines_from_before_sealing_stay_readable() {
    let dir = tempfile::tempdir().unwrap();
    let keys = TestKeys::with(&[]);
    let (store, inner) = sealed_jsonl(dir.path(), keys.clone());
    store
        .append(vec![event("acme", "s-1", "a")], 0)
        .await
        .unwrap();
    let raw = inner.read("acme", "s-1", 0).await.unwrap();
    assert!(matches!(raw[0].payload, Payload::RunClaimed(_)));

    keys.set(keys_of(&[("journal_key", Some(KEY_A))]));
    store
        .append(vec![event("acme", "s-1", "b")], 1)
        .await
        .unwrap();
    let raw = inner.read("acme", "s-1", 0).await.unwrap();
    assert!(matches!(raw[1].payload, Payload::Sealed(_)));
    let read = store.read("acme", "s-1", 0).await.unwrap();
    assert!(
        read.iter()
            .all(|e| matches!(e.payload, Payload::RunClaimed(_)))
    );

    keys.set(Vec::new());
    let error = store.read("acme", "s-1", 0).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("storage.encryption declares no key"),
        "{error}"
    );
    // `other` has no keys: clear.
    store
        .append(vec![event("other", "s-2", "c")], 0)
        .await
        .unwrap();
    assert_eq!(store.read("other", "s-2", 0).await.unwrap().len(), 1);
}

/// Files are sealed on disk under the address of their clear bytes, read back clear, and
/// refused when altered or when the key is gone; a clear file from before sealing reads as is.
#[tokio::test]
async fn files_are_sealed_on_disk_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let keys = TestKeys::with(&[("journal_key", Some(KEY_A))]);
    let inner: Arc<dyn ArtifactStore> = Arc::new(LocalArtifacts::new(dir.path()));
    let store = SealedArtifacts::new(inner.clone(), keys.clone());
    let clear = b"invoice: 1,250.00 EUR".to_vec();
    let uri = store
        .put("acme", "s-1", clear.clone(), "txt")
        .await
        .unwrap();
    let plain = inner
        .put("acme", "s-2", clear.clone(), "txt")
        .await
        .unwrap();
    assert_eq!(
        uri.rsplit('/').next(),
        plain.rsplit('/').next(),
        "the clear bytes' address"
    );

    let file = dir
        .path()
        .join("acme/s-1")
        .join(uri.rsplit('/').next().unwrap());
    let on_disk = std::fs::read(&file).unwrap();
    assert!(on_disk.starts_with(b"LOOMSEAL1"));
    assert_eq!(&on_disk[9..21], id_of(KEY_A).as_bytes());
    assert!(!on_disk.windows(7).any(|w| w == b"invoice"));
    assert_eq!(store.get(&uri).await.unwrap(), Some(clear.clone()));
    assert_eq!(store.get(&plain).await.unwrap(), Some(clear.clone()));

    let mut altered = on_disk.clone();
    *altered.last_mut().unwrap() ^= 1;
    std::fs::write(&file, &altered).unwrap();
    let error = store.get(&uri).await.unwrap_err();
    assert!(matches!(error, StoreError::Unsealable { .. }), "{error}");

    std::fs::write(&file, &on_disk).unwrap();
    keys.set(keys_of(&[("journal_key", None)]));
    let error = store.get(&uri).await.unwrap_err();
    assert!(matches!(error, StoreError::MissingKey { .. }), "{error}");
    assert_eq!(store.delete_session("acme", "s-1").await.unwrap(), 1);
}

/// A file handed to the sealing store already addressed (`put_at`) is sealed like any other:
/// nothing reaches the disk clear because a caller computed its address.
#[tokio::test]
async fn a_file_stored_at_its_address_is_sealed_too() {
    let dir = tempfile::tempdir().unwrap();
    let keys = TestKeys::with(&[("journal_key", Some(KEY_A))]);
    let inner: Arc<dyn ArtifactStore> = Arc::new(LocalArtifacts::new(dir.path()));
    let store = SealedArtifacts::new(inner, keys);
    let clear = b"invoice: 1,250.00 EUR".to_vec();
    use sha2::Digest as _;
    let hash = hex::encode(sha2::Sha256::digest(&clear));
    let uri = store
        .put_at("acme", "s-1", &hash, clear.clone(), "txt")
        .await
        .unwrap();
    let on_disk = std::fs::read(dir.path().join("acme/s-1").join(format!("{hash}.txt"))).unwrap();
    assert!(on_disk.starts_with(b"LOOMSEAL1"), "stored clear");
    assert_eq!(store.get(&uri).await.unwrap(), Some(clear));
}

// The reads a store answers from its indexes (PostgreSQL's), through the sealing wrapper.

/// A memory journal that answers the pushed-down reads itself, as a database would.
#[derive(Debug)]
struct Indexed(MemoryStore);

impl EventStore for Indexed {
    fn append(
        &self,
        batch: Vec<loom_core::Event>,
        expected: u64,
    ) -> loom_core::BoxFuture<'_, Result<Vec<loom_core::Event>, StoreError>> {
        self.0.append(batch, expected)
    }
    fn read<'a>(
        &'a self,
        t: &'a str,
        s: &'a str,
        after: u64,
    ) -> loom_core::BoxFuture<'a, Result<Vec<loom_core::Event>, StoreError>> {
        self.0.read(t, s, after)
    }
    fn last_seq<'a>(
        &'a self,
        t: &'a str,
        s: &'a str,
    ) -> loom_core::BoxFuture<'a, Result<u64, StoreError>> {
        self.0.last_seq(t, s)
    }
    fn sessions<'a>(
        &'a self,
        t: &'a str,
    ) -> loom_core::BoxFuture<'a, Result<Vec<loom_core::ports::SessionSummary>, StoreError>> {
        self.0.sessions(t)
    }
    fn delete<'a>(
        &'a self,
        t: &'a str,
        s: &'a str,
    ) -> loom_core::BoxFuture<'a, Result<u64, StoreError>> {
        self.0.delete(t, s)
    }
    fn search<'a>(
        &'a self,
        filter: &'a loom_core::search::EventFilter,
    ) -> loom_core::BoxFuture<'a, Result<Option<loom_core::search::Searched>, StoreError>> {
        Box::pin(async move {
            let mut found = Vec::new();
            for session in self.0.sessions(&filter.tenant_id).await? {
                let events = self
                    .0
                    .read(&filter.tenant_id, &session.session_id, 0)
                    .await?;
                found.extend(events.into_iter().filter(|e| filter.matches(e)));
            }
            Ok(Some(loom_core::search::Searched::Found(found)))
        })
    }
    fn recent_sessions<'a>(
        &'a self,
        t: &'a str,
        _since: Option<chrono::DateTime<chrono::Utc>>,
        limit: usize,
    ) -> loom_core::BoxFuture<'a, Result<Option<loom_core::search::RecentSessions>, StoreError>>
    {
        Box::pin(async move {
            let mut sessions = self.0.sessions(t).await?;
            let more = sessions.len() > limit;
            sessions.truncate(limit);
            Ok(Some(loom_core::search::RecentSessions { sessions, more }))
        })
    }
}

#[tokio::test]
async fn the_store_s_own_search_is_opened_and_declined_without_the_key() {
    let keys = TestKeys::with(&[("journal_key", Some(KEY_A))]);
    let inner: Arc<dyn EventStore> = Arc::new(Indexed(MemoryStore::new()));
    let journal = SealedJournal::new(inner.clone(), keys.clone());
    let written = journal
        .append(
            vec![started("t", "s", "r1", secret_metadata("secret-1"))],
            0,
        )
        .await
        .unwrap();
    let filter = loom_core::search::EventFilter {
        tenant_id: "t".into(),
        types: vec!["run.started".into()],
        limit: 10,
        ..Default::default()
    };
    // Underneath the payload is sealed; through the wrapper it is the clear event.
    match inner.search(&filter).await.unwrap() {
        Some(loom_core::search::Searched::Found(events)) => {
            assert!(matches!(events[0].payload, Payload::Sealed(_)));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        journal.search(&filter).await.unwrap(),
        Some(loom_core::search::Searched::Found(written))
    );
    let recent = journal
        .recent_sessions("t", None, 5)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(recent.sessions[0].session_id, "s");
    // Without the key the search is declined (the caller's scan names the session).
    keys.set(Vec::new());
    assert_eq!(journal.search(&filter).await.unwrap(), None);
    assert!(
        journal
            .recent_sessions("t", None, 5)
            .await
            .unwrap()
            .is_some()
    );
}
