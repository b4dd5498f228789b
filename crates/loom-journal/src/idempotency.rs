//! [`MemoryIdempotency`]: an in-process idempotency store, for tests and single-process use.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use loom_core::{
    BoxFuture,
    ports::{IdempotencyStore, Reservation, StoreError},
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
}

impl MemoryIdempotency {
    /// An empty store.
    pub fn new() -> MemoryIdempotency {
        MemoryIdempotency::default()
    }

    /// How many records it holds (expired ones included).
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
                records.insert(
                    key.to_owned(),
                    Record {
                        result: None,
                        expires_at: now.checked_add(ttl).unwrap_or(now + DEFAULT_FAR),
                        holder: holder.to_owned(),
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
}

/// Expiry used when `now + ttl` overflows.
const DEFAULT_FAR: Duration = Duration::from_secs(100 * 365 * 86_400);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reserve_complete_release() {
        let store = MemoryIdempotency::new();
        let ttl = Duration::from_secs(60);
        assert_eq!(
            store.reserve("k", "a", ttl).await.unwrap(),
            Reservation::Reserved
        );
        assert_eq!(
            store.reserve("k", "a", ttl).await.unwrap(),
            Reservation::Reserved
        );
        assert_eq!(
            store.reserve("k", "b", ttl).await.unwrap(),
            Reservation::Held
        );
        store.release("k", "a").await.unwrap();
        assert_eq!(
            store.reserve("k", "b", ttl).await.unwrap(),
            Reservation::Reserved
        );
        let output = ToolOutput::text("sent");
        store.complete("k", "b", &output).await.unwrap();
        assert_eq!(
            store.reserve("k", "c", ttl).await.unwrap(),
            Reservation::Completed(Box::new(output))
        );
        store.release("k", "b").await.unwrap();
        assert_eq!(store.len(), 1);
        assert_eq!(
            store.reserve("k", "d", Duration::ZERO).await.unwrap(),
            Reservation::Completed(Box::new(ToolOutput::text("sent")))
        );
    }
}
