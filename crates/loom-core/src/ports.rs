//! Ports: the object-safe traits through which the engine reaches storage and time.
//!
//! The model port lives in [`crate::model`] and the tool port in [`crate::tool`]. Every port is
//! used as `Arc<dyn Port>`; adapters implement them in their own crates.

use std::{fmt, sync::Arc, time::Duration};

use chrono::{DateTime, Utc};

use crate::{
    BoxFuture,
    event::{Event, EventReadError},
    tool::ToolOutput,
};

/// Why a journal operation failed, classified by kind.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The journal advanced since the writer read it: nothing was written; re-read and retry.
    #[error(
        "sequence conflict in {tenant_id}/{session_id}: expected last seq {expected}, found {found}"
    )]
    Conflict {
        /// Tenant.
        tenant_id: String,
        /// Session.
        session_id: String,
        /// What the writer expected.
        expected: u64,
        /// What the journal holds.
        found: u64,
    },
    /// A batch that mixes journals, or ids the store cannot hold.
    #[error("invalid append: {0}")]
    Invalid(String),
    /// A complete line of the journal cannot be read: it is "corrupted at `<file>:<line>`"
    /// (`loom sessions export --valid-only` and `loom sessions repair` recover the session).
    #[error("journal corrupted at {path}:{line}: {source}")]
    Corrupted {
        /// Journal file (or name).
        path: String,
        /// Line number, from 1.
        line: usize,
        /// Why.
        source: EventReadError,
    },
    /// Sealed content (`storage.encryption`) names a key the tenant does not have: none of its
    /// keys has this id, or the variable of one of its keys is unset or deleted
    /// (crypto-shredding). Nothing was read or written; what is recorded stays as it is.
    #[error("sealed journal: tenant '{tenant_id}' has no key {key_id}: {reason}")]
    MissingKey {
        /// Tenant.
        tenant_id: String,
        /// The key asked for: the 12-hex id a sealed payload or file names, or the secret name
        /// of the key that seals new writes.
        key_id: String,
        /// What the tenant has instead (its keys and their ids, the variable that is not set).
        reason: String,
    },
    /// Sealed content that its key does not open (altered bytes, or an envelope that is not
    /// the one it was sealed with), or a key value that is not a key: never read as clear.
    #[error("sealed journal: cannot open {what} of tenant '{tenant_id}': {reason}")]
    Unsealable {
        /// Tenant.
        tenant_id: String,
        /// What could not be opened or sealed (an event, a file).
        what: String,
        /// Why.
        reason: String,
    },
    /// The storage itself failed.
    #[error("journal IO error on {path}: {source}")]
    Io {
        /// Path involved.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
}

/// A session journal known to a store.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSummary {
    /// Session id.
    pub session_id: String,
    /// Last seq.
    pub last_seq: u64,
    /// Last write.
    pub updated_at: Option<DateTime<Utc>>,
}

/// A line of a journal (a row, in a database) that cannot be read, as [`EventStore::salvage`]
/// finds it.
#[derive(Debug, Clone, PartialEq)]
pub struct UnreadableLine {
    /// Its position: the line number from 1 (the row's seq in a database), which is also the
    /// seq the line holds.
    pub line: u64,
    /// Its bytes as stored (without the newline).
    pub bytes: Vec<u8>,
    /// Why it cannot be read.
    pub error: EventReadError,
    /// The run its envelope names, when that can be made out of the bytes (a hint: the line was
    /// not read).
    pub run_id: Option<String>,
}

/// What [`EventStore::salvage`] could read of a journal: every event that reads back, and every
/// line that does not.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Salvage {
    /// The journal, as errors name it (its file).
    pub path: String,
    /// The events that read back, in seq order (a seq is missing where a line is unreadable).
    pub events: Vec<Event>,
    /// The lines that do not read back, in order.
    pub unreadable: Vec<UnreadableLine>,
    /// Where [`EventStore::set_aside`] keeps the bytes of the lines it sets aside (a side file
    /// beside the journal, a table), as journaled in `session.repaired.moved_to`.
    pub aside: String,
}

/// An unreadable line to set aside ([`EventStore::set_aside`]): its position, the bytes it must
/// still hold, and the event taking its place.
#[derive(Debug, Clone, PartialEq)]
pub struct SetAside {
    /// The line (the row's seq in a database), as [`UnreadableLine::line`] gives it.
    pub line: u64,
    /// The bytes the line holds, as [`UnreadableLine::bytes`] gives them: a line that changed
    /// since is not touched.
    pub bytes: Vec<u8>,
    /// The event written in its place, whose `seq` must be `line` (a `session.repaired`).
    pub replacement: Event,
}

/// The journal port: one append-only sequence of events per `(tenant, session)`.
///
/// `append` assigns `seq` under optimistic concurrency: the batch is written only if the
/// journal's last seq is still `expected_last_seq`, else nothing is written and
/// [`StoreError::Conflict`] is returned. A batch is written whole or not at all.
pub trait EventStore: Send + Sync + fmt::Debug {
    /// Appends `batch` (all of one tenant and session) after `expected_last_seq`, returning the
    /// events with their seq.
    fn append(
        &self,
        batch: Vec<Event>,
        expected_last_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>>;

    /// Events of a session with `seq > after_seq`, in seq order.
    fn read<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>>;

    /// [`EventStore::append`] for a writer that shares its batch: it keeps the events (to
    /// write them again after a conflict) and only reads them once written; they come back
    /// shared. A store that keeps decoded events (the memory journal, the stores' caches of
    /// events read last) keeps and hands out the very events it was given when they already
    /// carry the seqs following `expected_last_seq` and their timestamps at the microsecond
    /// (as a line keeps them), and copies them otherwise. The default copies the batch for
    /// `append`; a store that overrides it writes, checks and refuses exactly as `append` does.
    fn append_shared<'a>(
        &'a self,
        batch: &'a [Arc<Event>],
        expected_last_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Arc<Event>>, StoreError>> {
        Box::pin(async move {
            let owned = batch.iter().map(|event| Event::clone(event)).collect();
            let written = self.append(owned, expected_last_seq).await?;
            Ok(written.into_iter().map(Arc::new).collect())
        })
    }

    /// [`EventStore::read`] for a reader that only reads the events: they come back shared,
    /// so that a store that keeps decoded events hands those out instead of copies. The
    /// default wraps what `read` returns; a store that overrides it reads and refuses exactly
    /// as `read` does.
    fn read_shared<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Arc<Event>>, StoreError>> {
        Box::pin(async move {
            let events = self.read(tenant_id, session_id, after_seq).await?;
            Ok(events.into_iter().map(Arc::new).collect())
        })
    }

    /// [`EventStore::last_of_type`] for a reader that only reads the event (a run's window
    /// reading the session's last snapshot): it comes back shared, the one a store keeps
    /// decoded instead of a copy. The default wraps what `last_of_type` returns.
    fn last_of_type_shared<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Arc<Event>>, StoreError>> {
        Box::pin(async move {
            let found = self
                .last_of_type(tenant_id, session_id, event_type, before_seq)
                .await?;
            Ok(found.map(Arc::new))
        })
    }

    /// The last seq of a session (0 when empty or absent).
    fn last_seq<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// The sessions of a tenant, most recent first.
    fn sessions<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SessionSummary>, StoreError>>;

    /// Deletes a session's journal (GDPR erasure) and returns how many events it held
    /// (0 when there was none).
    fn delete<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// The session of `tenant_id` whose journal holds the `run.started` of `run_id`, if any.
    ///
    /// A journal whose line names the run but cannot be read still counts (reading the session
    /// then says where it is corrupted). Stores answer from an index (a file, a database index);
    /// an index is never the truth: what it says is checked against the journal, and a stale one
    /// is rebuilt. The default reads every session, skipping those that cannot be read.
    fn find_run<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        Box::pin(async move {
            for session in self.sessions(tenant_id).await? {
                let events = match self.read(tenant_id, &session.session_id, 0).await {
                    Ok(events) => events,
                    Err(StoreError::Corrupted { .. }) => continue,
                    Err(other) => return Err(other),
                };
                let started = events
                    .iter()
                    .any(|e| e.run_id == run_id && e.event_type == "run.started");
                if started {
                    return Ok(Some(session.session_id));
                }
            }
            Ok(None)
        })
    }

    /// Reads a session keeping what can be read: the events that read back and the lines that
    /// do not (where [`EventStore::read`] stops at the first). A torn last line (an interrupted
    /// write) is neither. The default is `read`, for stores that cannot hold an unreadable line.
    fn salvage<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Salvage, StoreError>> {
        Box::pin(async move {
            Ok(Salvage {
                path: format!("{tenant_id}/{session_id}"),
                events: self.read(tenant_id, session_id, 0).await?,
                unreadable: Vec::new(),
                aside: String::new(),
            })
        })
    }

    /// Sets unreadable lines aside: each line's bytes are kept where [`Salvage::aside`] says
    /// (made durable first), then the line is replaced in the journal by its replacement event,
    /// at the same seq, so that the journal reads again. All or nothing; refused
    /// ([`StoreError::Invalid`]) when a line no longer holds the bytes given, or a replacement
    /// does not belong to the journal or carries another seq. The default refuses: a store that
    /// cannot hold an unreadable line has none to set aside.
    fn set_aside<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        lines: Vec<SetAside>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            match lines.first() {
                None => Ok(()),
                Some(first) => Err(StoreError::Invalid(format!(
                    "journal {tenant_id}/{session_id} holds no unreadable line {}",
                    first.line
                ))),
            }
        })
    }

    /// Answers an event search from the store's own indexes, in the store's write order (each
    /// session's journal order kept), with the work proportional to what it returns; `None`
    /// when the store cannot (the default), and the caller then scans the sessions. A store
    /// that answers returns the events that pass [`EventFilter::matches`] and read back.
    ///
    /// [`EventFilter::matches`]: crate::search::EventFilter::matches
    fn search<'a>(
        &'a self,
        filter: &'a crate::search::EventFilter,
    ) -> BoxFuture<'a, Result<Option<crate::search::Searched>, StoreError>> {
        let _ = filter;
        Box::pin(async { Ok(None) })
    }

    /// The `limit` most recently written sessions of `tenant_id` whose last event was written
    /// at or after `since` (when given), most recent first, from the store's own index, and
    /// whether there are more; `None` when the store cannot (the default): the caller then
    /// filters [`EventStore::sessions`]. A store that answers lists what `sessions` would, in
    /// the same order.
    fn recent_sessions<'a>(
        &'a self,
        tenant_id: &'a str,
        since: Option<DateTime<Utc>>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Option<crate::search::RecentSessions>, StoreError>> {
        let _ = (tenant_id, since, limit);
        Box::pin(async { Ok(None) })
    }

    /// The seq of the `run.started` of `run_id` in a session, from the store's run index, so
    /// that a reader of one run (a follower) need not read the session before it; `None` when
    /// the store cannot tell without reading the session (the default) or the run is not there.
    /// A hint, never the truth: the reader still checks what it reads from there.
    fn run_start<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        let _ = (tenant_id, session_id, run_id);
        Box::pin(async { Ok(None) })
    }

    /// The last event of a session whose `type` is `event_type` and whose seq is below
    /// `before_seq` (`u64::MAX`: anywhere), so that a reader can start from a marker (a
    /// `session.snapshot`) instead of the session's first event. Stores answer from an index
    /// (a type index, the offsets beside a JSONL file) with the work proportional to what they
    /// return; the default reads the session.
    fn last_of_type<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Event>, StoreError>> {
        Box::pin(async move {
            let events = self.read(tenant_id, session_id, 0).await?;
            Ok(events
                .into_iter()
                .rev()
                .find(|e| e.seq < before_seq && e.event_type == event_type))
        })
    }
}

/// Events handed out shared ([`EventStore::read_shared`]) as owned events: each one copied,
/// unless nothing else holds it any more.
pub fn owned_events(events: Vec<Arc<Event>>) -> Vec<Event> {
    events.into_iter().map(Arc::unwrap_or_clone).collect()
}

/// The clock port: the only source of wall-clock time for the engine.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Now, in UTC.
    fn now(&self) -> DateTime<Utc>;
}

/// The artifact store port: files kept beside the journal (offloaded results, attachments),
/// content-addressed by URI `artifact://<tenant>/<session>/<sha256>.<ext>`.
pub trait ArtifactStore: Send + Sync + fmt::Debug {
    /// Stores `bytes` and returns their URI (storing the same bytes twice is harmless).
    fn put<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        bytes: Vec<u8>,
        extension: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>>;

    /// Stores `bytes` at the content address the caller computed (`sha256_hex`, the digest of
    /// the clear bytes) and returns its URI: how the sealing store keeps a file's sealed bytes
    /// where its clear bytes would be, so that the URI stays the clear bytes' address. The
    /// default refuses ([`StoreError::Invalid`]): a store that cannot hold sealed files.
    fn put_at<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        sha256_hex: &'a str,
        bytes: Vec<u8>,
        extension: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        let _ = (sha256_hex, bytes);
        Box::pin(async move {
            Err(StoreError::Invalid(format!(
                "this artifact store cannot keep sealed files (artifact of {tenant_id}/{session_id}, \
                 .{extension})"
            )))
        })
    }

    /// The bytes behind `uri`, `None` when there are none.
    fn get<'a>(&'a self, uri: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, StoreError>>;

    /// Deletes every artifact of a session (GDPR erasure); returns how many there were.
    fn delete_session<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;
}

/// The URI of an artifact: `artifact://<tenant>/<session>/<sha256 hex>.<ext>`.
pub fn artifact_uri(
    tenant_id: &str,
    session_id: &str,
    sha256_hex: &str,
    extension: &str,
) -> String {
    format!("artifact://{tenant_id}/{session_id}/{sha256_hex}.{extension}")
}

/// Refuses what cannot name an artifact, whatever the store: a tenant or session id that is
/// not safe (it names a folder, a row), an extension that is empty, longer than 16 characters
/// or not ASCII alphanumeric.
pub fn check_artifact_address(
    tenant_id: &str,
    session_id: &str,
    extension: &str,
) -> Result<(), StoreError> {
    for (what, id) in [("tenant", tenant_id), ("session", session_id)] {
        if !crate::ids::is_safe_id(id) {
            return Err(StoreError::Invalid(format!(
                "{what} id '{id}' is not usable for artifacts"
            )));
        }
    }
    if extension.is_empty()
        || extension.len() > 16
        || !extension.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(StoreError::Invalid(format!(
            "artifact extension '{extension}' is not usable"
        )));
    }
    Ok(())
}

/// Refuses a content address that is not a SHA-256 in lowercase hex (what
/// [`ArtifactStore::put_at`] is given).
pub fn check_content_hash(sha256_hex: &str) -> Result<(), StoreError> {
    let hex = sha256_hex.len() == 64
        && sha256_hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if hex {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "artifact address '{sha256_hex}' is not a SHA-256 in lowercase hex"
        )))
    }
}

/// Who a tool source opens its tools for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceContext {
    /// Tenant (a `tenant`-scoped source keeps one connection per tenant).
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// Run (a `run`-scoped source opens and closes its connection with the run).
    pub run_id: String,
}

/// A circuit breaker that opened while a source was used, for the journal.
#[derive(Debug, Clone, PartialEq)]
pub struct CircuitNotice {
    /// What it guards (`mcp:<server>`).
    pub target: String,
    /// Consecutive failures that opened it.
    pub failures: u32,
    /// Seconds it stays open.
    pub cooldown_s: f64,
    /// The last error.
    pub error: String,
}

/// A tool source that could not give its tools.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct SourceError {
    /// Why, for the journal and the logs.
    pub message: String,
    /// The breaker that opened on this failure, if any.
    pub circuit: Option<CircuitNotice>,
}

/// The tool-source port: a provider of tools discovered at run time (an MCP server).
///
/// The engine opens every source of an agent when it starts driving a run; a source that fails
/// has its tools withdrawn from the run (`tool.source_unavailable`), or fails the run when the
/// agent requires it.
pub trait ToolSource: Send + Sync + fmt::Debug {
    /// The source's name as journaled (`tool.source_unavailable.source`).
    fn name(&self) -> &str;

    /// The tools of this source for a run, named as the model will see them.
    fn open<'a>(
        &'a self,
        ctx: &'a SourceContext,
    ) -> BoxFuture<'a, Result<Vec<std::sync::Arc<dyn crate::tool::Tool>>, SourceError>>;

    /// The run no longer needs the source (a run-scoped connection closes here).
    fn release<'a>(&'a self, ctx: &'a SourceContext) -> BoxFuture<'a, ()>;

    /// The process is stopping: close every connection (child processes included).
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// What [`IdempotencyStore::reserve`] found for a key.
#[derive(Debug, Clone, PartialEq)]
pub enum Reservation {
    /// The key is now held by the caller (it was free, expired, or already the caller's):
    /// run the action, then [`IdempotencyStore::complete`] or [`IdempotencyStore::release`].
    Reserved,
    /// The action already ran: its recorded result.
    Completed(Box<ToolOutput>),
    /// Another holder is running the action now.
    Held,
}

/// The session a reservation is made for: erasing the session ([`IdempotencyStore::delete_session`])
/// erases the keys it reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyScope<'a> {
    /// The tenant.
    pub tenant_id: &'a str,
    /// The session of the run that reserves.
    pub session_id: &'a str,
}

/// How long an idempotency record lives by default (24 h).
pub const DEFAULT_IDEMPOTENCY_TTL: Duration = Duration::from_secs(86_400);

/// The idempotency store port: records `{key, status: in_progress | completed, result,
/// expires_at}` plus the holder token, shared by every run (and process) that uses the store.
///
/// Keys of business idempotency are `<tenant>:<tool>:<business key>`.
pub trait IdempotencyStore: Send + Sync + fmt::Debug {
    /// Takes `key` for `holder` for `ttl`, unless it is completed or held by someone else.
    /// The record belongs to `scope`'s session (the last one to take it).
    fn reserve<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
        scope: IdempotencyScope<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>>;

    /// Records the result of the action behind `key` (held by `holder`).
    fn complete<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
        output: &'a ToolOutput,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Gives `key` back without a result (the action failed): the next caller may run it.
    fn release<'a>(
        &'a self,
        key: &'a str,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Erases every record of a session (GDPR), completed or not. Returns how many went.
    fn delete_session<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;
}
