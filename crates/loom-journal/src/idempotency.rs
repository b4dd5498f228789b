//! [`MemoryIdempotency`]: an in-process idempotency store, for tests and single-process use.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use loom_core::{
    BoxFuture,
    ports::{IdempotencyScope, IdempotencyStore, Reservation, StoreError},
    tool::ToolOutput,
};

/// An in-process [`IdempotencyStore`]: records live in a map behind a mutex, lost at exit.
#[derive(Debug, Default)]
pub struct MemoryIdempotency {
    records: Mutex<HashMap<String, Record>>,
}

#[derive(Debug)]
struct Record {
    result: Option<ToolOutput>,
    expires_at: Instant,
    holder: String,
    tenant_id: String,
    session_id: String,
}

impl MemoryIdempotency {
    /// An empty store.
    pub fn new() -> MemoryIdempotency {
        MemoryIdempotency::default()
    }

    /// How many records it holds (expired ones included, until the table next doubles).
    pub fn len(&self) -> usize {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl IdempotencyStore for MemoryIdempotency {
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
        scope: IdempotencyScope<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        let now = Instant::now();
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let outcome = match records.get(key).filter(|r| r.expires_at > now) {
            Some(Record {
                result: Some(output),
                ..
            }) => Reservation::Completed(Box::new(output.clone())),
            Some(record) if record.holder != holder => Reservation::Held,
            _ => {
                // Expired records answer nothing: they go once the table has doubled since
                // the last time, so that keys used once do not pile up (amortized O(1)).
                let len = records.len();
                if len >= PURGE_FROM && len.is_power_of_two() {
                    records.retain(|_, record| record.expires_at > now);
                }
                records.insert(
                    key.to_owned(),
                    Record {
                        result: None,
                        expires_at: now.checked_add(ttl).unwrap_or(now + DEFAULT_FAR),
                        holder: holder.to_owned(),
                        tenant_id: scope.tenant_id.to_owned(),
                        session_id: scope.session_id.to_owned(),
                    },
                );
                Reservation::Reserved
            }
        };
        Box::pin(async move { Ok(outcome) })
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
        output: &'a ToolOutput,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(record) = records.get_mut(key).filter(|r| r.holder == holder) {
            record.result = Some(output.clone());
        }
        Box::pin(async { Ok(()) })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        if records
            .get(key)
            .is_some_and(|r| r.holder == holder && r.result.is_none())
        {
            records.remove(key);
        }
        Box::pin(async { Ok(()) })
    }

    fn delete_session<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let before = records.len();
        records.retain(|_, r| r.tenant_id != tenant_id || r.session_id != session_id);
        let deleted = (before - records.len()) as u64;
        Box::pin(async move { Ok(deleted) })
    }
}

/// The size from which expired records are purged (each time the table reaches a power of two).
const PURGE_FROM: usize = 64;

/// Expiry used when `now + ttl` overflows.
const DEFAULT_FAR: Duration = Duration::from_secs(100 * 365 * 86_400);

#[cfg(test)]
mod tests {
    use super::*;

    const S1: IdempotencyScope<'static> = IdempotencyScope {
        tenant_id: "t",
        session_id: "s1",
    };
    const S2: IdempotencyScope<'static> = IdempotencyScope {
        tenant_id: "t",
        session_id: "s2",
    };
    const OTHER_TENANT: IdempotencyScope<'static> = IdempotencyScope {
        tenant_id: "u",
        session_id: "s1",
    };

    #[tokio::test]
    async fn delete_session_erases_its_keys_only() {
        let store = MemoryIdempotency::new();
        let ttl = Duration::from_secs(60);
        let output = ToolOutput::text("sent");
        store.reserve("done", "a", S1, ttl).await.unwrap();
        store.complete("done", "a", &output).await.unwrap();
        store.reserve("running", "b", S1, ttl).await.unwrap();
        store.reserve("kept", "c", S2, ttl).await.unwrap();
        store
            .reserve("other", "d", OTHER_TENANT, ttl)
            .await
            .unwrap();
        assert_eq!(store.delete_session("t", "s1").await.unwrap(), 2);
        assert_eq!(store.len(), 2);
        assert_eq!(
            store.reserve("done", "e", S2, ttl).await.unwrap(),
            Reservation::Reserved
        );
        assert_eq!(
            store.reserve("kept", "e", S2, ttl).await.unwrap(),
            Reservation::Held
        );
        assert_eq!(
            store.reserve("other", "e", S2, ttl).await.unwrap(),
            Reservation::Held
        );
        assert_eq!(store.delete_session("t", "s1").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn expired_records_do_not_pile_up() {
        let store = MemoryIdempotency::new();
        let output = ToolOutput::text("sent");
        for i in 0..1000 {
            let key = format!("once-{i}");
            store.reserve(&key, "a", S1, Duration::ZERO).await.unwrap();
            store.complete(&key, "a", &output).await.unwrap();
        }
        assert!(store.len() <= PURGE_FROM, "{} records", store.len());
        // A live record stays through the purges.
        let ttl = Duration::from_secs(600);
        store.reserve("live", "a", S1, ttl).await.unwrap();
        store.complete("live", "a", &output).await.unwrap();
        for i in 0..1000 {
            let key = format!("again-{i}");
            store.reserve(&key, "a", S1, Duration::ZERO).await.unwrap();
        }
        assert_eq!(
            store.reserve("live", "b", S1, ttl).await.unwrap(),
            Reservation::Completed(Box::new(output))
        );
    }

    #[tokio::test]
    async fn reserve_complete_release() {
        let store = MemoryIdempotency::new();
        let ttl = Duration::from_secs(60);
        assert_eq!(
            store.reserve("k", "a", S1, ttl).await.unwrap(),
            Reservation::Reserved
        );
        assert_eq!(
            store.reserve("k", "a", S1, ttl).await.unwrap(),
            Reservation::Reserved
        );
        assert_eq!(
            store.reserve("k", "b", S1, ttl).await.unwrap(),
            Reservation::Held
        );
        store.release("k", "a").await.unwrap();
        assert_eq!(
            store.reserve("k", "b", S1, ttl).await.unwrap(),
            Reservation::Reserved
        );
        let output = ToolOutput::text("sent");
        store.complete("k", "b", &output).await.unwrap();
        assert_eq!(
            store.reserve("k", "c", S1, ttl).await.unwrap(),
            Reservation::Completed(Box::new(output))
        );
        store.release("k", "b").await.unwrap();
        assert_eq!(store.len(), 1);
        assert_eq!(
            store.reserve("k", "d", S1, Duration::ZERO).await.unwrap(),
            Reservation::Completed(Box::new(ToolOutput::text("sent")))
        );
    }
}
