//! # loom-sqlite
//!
//! Loom's embedded durable journal: [`SqliteStore`], an [`EventStore`] keeping every session of
//! every tenant in one SQLite file.
//!
//! ## Layout
//!
//! One table, `events`, one row per event, primary key `(tenant_id, session_id, seq)`:
//!
//! | column | holds |
//! |---|---|
//! | `tenant_id`, `session_id`, `seq` | the journal and the position in it (from 1, contiguous) |
//! | `event_id`, `ts`, `run_id`, `root_run_id`, `type`, `category`, `status`, `agent`, `role` | the envelope, for queries (`ts` is RFC 3339 UTC with microseconds, so it sorts as text) |
//! | `facets` | the event's facets, as JSON text |
//! | `event` | the event itself, the compact line of [`Event::to_json`], verbatim |
//! | `ingested` | a write counter: orders sessions by their last append |
//!
//! Indexes: by run (`tenant_id, run_id, seq`), by event id (`tenant_id, event_id`), by
//! ingestion (`ingested`), by session and type
//! (`tenant_id, session_id, type, seq`, behind [`EventStore::last_of_type`]: one row read), and
//! in write order per tenant (`events_tenant_ingested`: `tenant_id, ingested, session_id, seq`)
//! and per tenant and type (`events_tenant_type`: `tenant_id, type, ingested, session_id, seq`),
//! behind [`EventStore::search`]. The last three are created in every file when it opens, older
//! ones included: an index changes nothing an older build reads, and SQLite keeps it up to date
//! whoever writes. The by-type index of earlier builds (`events_type`: `tenant_id, type`) is
//! dropped when a file opens: it is a prefix of `events_tenant_type`, and every index is one
//! more b-tree each append writes. The schema version is kept in `PRAGMA user_version` (1); a file written by a
//! newer schema is refused.
//!
//! Reads only trust the `event` column: every row is parsed back with [`Event::from_json`] and
//! must belong to its journal, carry its row's seq and follow the previous row without a gap.
//! A row that does not is never skipped: it is reported as [`StoreError::Corrupted`] naming the
//! file and the journal, with the row's seq as the line number.
//!
//! The same file also holds the `idempotency` table of [`SqliteIdempotency`], the
//! [`IdempotencyStore`](loom_core::ports::IdempotencyStore) for business keys.
//!
//! ## Guarantees, the same as the JSONL journal
//!
//! `append(batch, expected_last_seq)` checks the batch (one journal, safe ids, every event
//! well-formed), then opens a write transaction with `BEGIN IMMEDIATE` — SQLite's write lock,
//! taken before anything is read — compares the journal's last seq with `expected_last_seq`
//! and, if they differ, rolls back and returns [`StoreError::Conflict`] having written nothing.
//! Otherwise the batch receives seq `last + 1, last + 2, …` and is committed whole. One writer
//! holds the lock at a time (for the whole file, so a fortiori per session); others wait up to
//! the busy timeout (30 s). Readers never wait for writers (WAL), and several processes may
//! open the same file.
//!
//! ## Group commit
//!
//! Within a process, every append goes through one connection, the writer. Appends that arrive
//! while a transaction is being written and synced wait for it, and the next caller to hold the
//! writer writes all of them in one transaction: each batch with its own seq check and its own
//! `INSERT` (a conflict or a failed insert refuses that batch alone), then one `COMMIT`, whose
//! WAL sync covers them all. Each caller is answered only after that commit returned. So a
//! hundred concurrent runs share a sync instead of queueing for a hundred, and the writer's page
//! cache stays valid from one append to the next.
//!
//! ## Reads pushed down
//!
//! As on PostgreSQL, [`EventStore::search`] (behind `Loom::query`) is one SQL query in write
//! order — `ingested`, then `session_id` and `seq`, which keeps each session's journal order —
//! with every filter of [`EventFilter`] a test on bound values, `after` the position of the
//! event it names and `LIMIT`, through the index its most selective filter picks (a session's,
//! a run's, the types', else the tenant's in write order, from the cursor). An event's `ts`
//! filter compares the `ts` column with the bound written the same way (rounded up to the
//! microsecond). [`EventStore::recent_sessions`] (behind `Loom::runs`) is the session list's
//! query — each session's last row, most recently appended first — filtered on the last
//! event's `ts` and cut at the limit: one pass over the tenant's index entries, and only the
//! events returned are read. A row
//! that does not read back, or whose columns disagree with its event, makes either decline
//! (`None`), and the caller scans the sessions with its rules for corrupted journals. The
//! queries are in `search.rs`.
//!
//! ## Durability and erasure
//!
//! The file runs in WAL mode with `synchronous = FULL`: a commit returns only once the WAL is
//! fsynced, so `append` returning means the batch survives a crash or a power loss, and a crash
//! mid-append loses that batch whole (SQLite rolls the transaction back), never part of it.
//! The exception is a batch nothing outside the run depends on
//! ([`loom_core::event::must_sync`] is false: steps, model answers, tool results, …): its
//! transaction commits with `synchronous = NORMAL`, durable against a process crash, and on disk
//! with the next FULL commit (which syncs the whole WAL). Every write transaction of the crate
//! sets its level in its own `BEGIN` (`PRAGMA synchronous = …; BEGIN IMMEDIATE`), so the level a
//! pooled connection was left at never decides another transaction's.
//! `secure_delete = ON` overwrites the content of deleted rows; after a
//! [`delete`](loom_core::ports::EventStore::delete) the WAL is checkpointed and truncated (best effort: a reader
//! still holding an old snapshot delays it) so that erased events do not linger in it.
//!
//! ## Runtime
//!
//! [`SqliteStore::connect`] opens the file inside a tokio runtime without blocking a worker
//! thread; [`SqliteStore::open`] is for synchronous callers (it creates the file and the schema
//! on a helper thread, and blocks until they are ready). The store's futures must be polled
//! inside a tokio runtime, where its connection pool is created at first use.
//!
//! ## Unreadable rows
//!
//! A row whose event does not read back cannot come from an append (every event is read back
//! with the reader's limits before it is written); [`EventStore::salvage`] reads around one and
//! [`EventStore::set_aside`] copies it to the table `set_aside` (`tenant_id, session_id, seq,
//! event, set_aside_at`, created in every file) and rewrites the row with its replacement
//! event, in one `BEGIN IMMEDIATE` transaction. Erasing a session erases its rows set aside.
//! [`EventStore::find_run`] is a query on the run index (`events_run`).
//!
//! [`EventStore`]: loom_core::ports::EventStore
//! [`EventStore::salvage`]: loom_core::ports::EventStore::salvage
//! [`EventStore::set_aside`]: loom_core::ports::EventStore::set_aside
//! [`EventStore::find_run`]: loom_core::ports::EventStore::find_run
//! [`EventStore::last_of_type`]: loom_core::ports::EventStore::last_of_type
//! [`EventStore::search`]: loom_core::ports::EventStore::search
//! [`EventStore::recent_sessions`]: loom_core::ports::EventStore::recent_sessions
//! [`EventFilter`]: loom_core::search::EventFilter
//! [`Event::to_json`]: loom_core::event::Event::to_json
//! [`Event::from_json`]: loom_core::event::Event::from_json
//! [`StoreError::Conflict`]: loom_core::ports::StoreError::Conflict
//! [`StoreError::Corrupted`]: loom_core::ports::StoreError::Corrupted

mod idempotency;
mod repair;
mod search;
mod store;
mod writer;

pub use idempotency::SqliteIdempotency;
pub use store::{SCHEMA_VERSION, SqliteStore};
