//! # loom-journal
//!
//! The journals of Loom: two implementations of the [`EventStore`] port.
//!
//! - [`MemoryStore`]: in-process, lost at exit; for tests and ephemeral runs. It keeps each event
//!   as its journal line, compressed (LZ4) once its session goes quiet ([`Footprint`] says how much).
//! - [`JsonlStore`]: one file per session at `<root>/<tenant>/<session>.jsonl`, one event per
//!   line (the compact JSON of [`Event::to_json`], newline-terminated).
//!
//! It also holds [`MemoryIdempotency`], an in-process idempotency store for tests, and
//! [`MemoryBus`], the event bus of a service of one process.
//!
//! Both stores behave the same way: `append(batch, expected_last_seq)` checks that every event
//! of the batch belongs to one `(tenant, session)` journal with safe ids
//! ([`loom_core::ids::is_safe_id`]), then, under an exclusive lock, compares the journal's last
//! seq with `expected_last_seq`. If they differ, nothing is written and
//! [`StoreError::Conflict`] is returned; otherwise the batch receives seq `last + 1, last + 2, …`
//! and is written whole. A writer that lost a race therefore gets a conflict, never a gap or a
//! duplicate seq.
//!
//! ## What the JSONL store flushes to disk, and why that is enough
//!
//! Every append runs under an exclusive OS file lock on the journal file (so several processes
//! may share a root) and performs, in order:
//!
//! 1. **one `write_all`** of all the lines of the batch at the end of the journal (if it fails
//!    midway the file is truncated back to its previous length);
//! 2. **`fsync` of the journal file** (`sync_data`) before `append` returns, when the batch
//!    holds an event something outside the run depends on
//!    ([`loom_core::event::must_sync`]: a run or message accepted, a tool that may act about
//!    to run, an approval, a run's end, …); the other batches (steps, model answers, tool
//!    results, …) are written without waiting for the disk and become durable with the next
//!    synced one;
//! 3. **`fsync` of the tenant directory** when the batch is the first content of the file (the
//!    file was just created), and of the root directory when the tenant directory was just
//!    created, so that a new session file — its directory entry — survives a crash; without it
//!    the data could be durable while the name pointing to it is lost.
//!
//! The syncs of steps 2 and 3 go through the store's **group commit** (`group.rs`), the file's
//! lock held: an append alone is synced as above; appends of several sessions asking at the
//! same time are made durable together, on Linux by one `syncfs` of their filesystem (one
//! commit of its journal, one flush of the disk) instead of a `fdatasync` each. If the sync
//! fails, the batch is truncated back, as when its write fails.
//!
//! When a torn last line is repaired (see below), the torn bytes are appended to
//! `<session>.jsonl.corrupt` and that file is fsynced *before* the journal is truncated, so no
//! byte ever written is lost. Nothing else is flushed: reads, `last_seq` and `sessions` only
//! read.
//!
//! These flushes are enough for Loom's guarantees because the engine **appends every event
//! before it applies it**: `append` returns only once the batch is written (the OS holds it: a
//! process crash or `kill -9` loses nothing), and once it is on disk when anything outside
//! depends on it, so after a crash of the process the journal holds every fact the engine acted
//! on, and after a power loss every fact something outside acted on (an event lost there is
//! re-derived by the resumed run: a model asked again, a call whose outcome is unknown — never
//! a tool run twice unknowingly, since its `tool.called` was synced). A crash during an append can only
//! leave the *last* batch incomplete — a batch the engine had not yet applied, since `append`
//! had not returned — and that shows as a torn last line (bytes not ending with `'\n'`):
//!
//! - on read it is ignored, with a `tracing` warning;
//! - at the next append it is moved aside to `<session>.jsonl.corrupt` and the journal is
//!   truncated to its last complete line before writing, so the next seq follows that line.
//!
//! A *complete* line that cannot be read (bad JSON, unsupported version, envelope contradicting
//! its payload, foreign session, seq out of order) is never skipped: it is reported as
//! [`StoreError::Corrupted`] with its line number. Journals are independent files, so one
//! corrupted session never affects another. Such a line cannot come from an append (every
//! event's line is checked against the reader's limits as it is serialized, once, and that
//! line is what is written: `loom_core::journal::Line`), only from the disk, a
//! hand edit or an older version; `salvage` reads around it and `set_aside` recovers the
//! session: the line's bytes are appended to `<session>.jsonl.corrupt` and fsynced, then the
//! journal is written anew beside itself with the replacement event (`session.repaired`) at the
//! line's seq, fsynced, and renamed over the old file (and the directory fsynced). An appender
//! that waited for the old file's lock notices the rename and reopens the journal.
//!
//! ## The run index
//!
//! `<root>/<tenant>/.runs` maps run ids to the session file (and offset) of their `run.started`,
//! so that `find_run` answers without reading every session. It is a cache, never the truth:
//! appended after each durable batch that starts a run, without fsync; an entry is used only
//! once the line it points to checks out; a lookup that finds nothing first reads what was
//! appended to each session file since the index last saw it (any writer's appends; a file
//! new, shorter, replaced or rewritten — told by its identity, modification time, length and a
//! fingerprint of its start and of the end of what was read — from its start); a missing or
//! unreadable index is rebuilt.
//!
//! ## The offset index
//!
//! `<root>/<tenant>/<session>.jsonl.idx` says where the lines of one session file start (every
//! 64th line, each `run.started`, `session.snapshot` and `session.compacted`, and the last line
//! indexed), so that `read(after_seq)`, `last_of_type` and `run_start` go to the lines they
//! return and decode only those. It is a cache too: appended after each durable batch, without
//! fsync; every offset is checked before use (the line there must carry the expected seq); a
//! file replaced, shortened or rewritten is indexed again and a file grown by another writer is
//! indexed from where the index stopped, by counting newlines (a line's seq is its number: no
//! JSON is parsed); a missing, torn or garbled index is rebuilt. Erasing a session erases it. A
//! journal shorter than 16 KiB (a session of one run) has no `.idx` file: its index is built
//! from the file by the store that reads it and kept in memory, since creating a file per
//! session cost its run more than reading 16 KiB.
//!
//! [`Event::to_json`]: loom_core::event::Event::to_json
//! [`EventStore`]: loom_core::ports::EventStore
//! [`StoreError::Conflict`]: loom_core::ports::StoreError::Conflict
//! [`StoreError::Corrupted`]: loom_core::ports::StoreError::Corrupted

mod artifacts;
mod bus;
mod group;
mod idempotency;
mod index;
mod jsonl;
mod memory;
mod offsets;
mod queue;
mod repair;
mod search;
mod seek;

pub use artifacts::{LocalArtifacts, MemoryArtifacts};
pub use bus::{MEMORY_BUS_CAPACITY, MemoryBus};
pub use idempotency::MemoryIdempotency;
pub use jsonl::JsonlStore;
pub use memory::{Footprint, MemoryStore};
pub use queue::MemoryQueue;
