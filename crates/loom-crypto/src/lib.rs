//! # loom-crypto
//!
//! Encryption at rest (`storage.encryption`, reference §9): AES-256-GCM with each tenant's key,
//! applied by wrapping the storage ports, so every durable backend (JSONL, SQLite, PostgreSQL)
//! is sealed the same way without knowing it.
//!
//! - [`SealedJournal`] wraps an `EventStore`: payloads are sealed on append and opened on read;
//!   envelopes stay clear (ids, time, type, status, facets), so filtering, listing, the run
//!   index and deletion work without a key.
//! - [`SealedArtifacts`] wraps an `ArtifactStore`: files are sealed, their URI stays the
//!   address of their clear bytes.
//! - [`KeySource`] is how the facade hands a tenant's keys over, read again at every operation
//!   ([`keys`]); [`seal`] is the byte format, with its test vectors.
//!
//! A sealed payload that names a key the tenant lacks is [`StoreError::MissingKey`]; one its key
//! does not open (altered bytes, a moved envelope) is [`StoreError::Unsealable`]: never garbage.
//!
//! [`StoreError::MissingKey`]: loom_core::ports::StoreError::MissingKey
//! [`StoreError::Unsealable`]: loom_core::ports::StoreError::Unsealable

pub mod artifacts;
pub mod journal;
pub mod keys;
pub mod seal;

pub use artifacts::SealedArtifacts;
pub use journal::SealedJournal;
pub use keys::{KeySecret, KeySource, Keyring};
