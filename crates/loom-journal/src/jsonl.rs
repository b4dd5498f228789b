//! The JSONL store: one append-only file per session.

use std::{
    fs::{self, File, TryLockError},
    io::{self, BufRead, BufReader, Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    sync::Arc,
    time::SystemTime,
};

use loom_core::{
    BoxFuture,
    event::{Event, EventReadError},
    ports::{EventStore, Salvage, SessionSummary, SetAside, StoreError},
};
use tracing::warn;

use crate::{
    group::GroupSync,
    index::tenant_index,
    offsets::{OffsetsCache, index_path},
};

use loom_core::journal::{Batch, Decoded, safe_id};

mod append;

use append::AtOnce;

/// Bytes read by the first backward step when looking for the last line of a journal (the
/// step doubles until the line is found).
pub(crate) const TAIL_CHUNK: usize = 16 * 1024;

/// Extension of a journal file.
pub(crate) const EXTENSION: &str = "jsonl";

/// How many times an append reopens a journal file that was replaced (a repair) while it
/// waited for its lock.
const REOPEN_ATTEMPTS: usize = 16;

/// An [`EventStore`] keeping one file per session at `<root>/<tenant>/<session>.jsonl`, one event
/// per line (the compact JSON of [`Event::to_json`], newline-terminated).
///
/// Appends hold an exclusive OS lock on the file (reads a shared one), so several stores, in
/// one process or several, may share a root. See the crate documentation for what is flushed
/// to disk and how torn or corrupted lines are handled.
///
/// - `read(after_seq)` seeks to the first line after `after_seq` through the session's offset
///   index (`<session>.jsonl.idx`, see `offsets.rs`: a cache checked at every use and rebuilt
///   from the file by counting newlines when stale or missing) and parses and checks only the
///   lines it returns; `read(0)` reads the whole file. `append` and `last_seq` only read the
///   file backwards to its last complete line.
/// - `last_of_type` answers `run.started`, `session.snapshot` and `session.compacted` from the
///   index's marks, decoding the one line returned; another type is looked for backwards from
///   `before_seq`, one stretch of 64 lines at a time, by the envelope's type (no parse).
/// - `run_start` answers from the same marks.
/// - `sessions` orders journals by file mtime, most recent first; a journal whose last line is
///   corrupted is left out of the list with a warning rather than failing the whole listing.
/// - `find_run` answers from the tenant's run index (`<root>/<tenant>/.runs`, see below), a
///   cache checked against the files and rebuilt from them when stale or missing: an unknown run
///   costs a directory listing and the bytes appended since the last lookup, not a read of every
///   session.
/// - `search` answers from the tenant's search index (`<root>/<tenant>/.search/`, see
///   `search.rs`): the envelopes of the events by type, brought up to date with what was
///   written since the last search; a search reads the entries of the types it asks for and
///   decodes only the events it returns. A tenant holding a line that does not read back is
///   declined (the caller's scan leaves that session out, naming it).
/// - `salvage` and `set_aside` let an operator recover a journal holding an unreadable line:
///   the line's bytes are appended to `<session>.jsonl.corrupt` (synced), and the journal is
///   written anew with the replacement event in its place, then renamed over the old one.
///
/// File IO that could wait for a sync or for a lock another holds, or read a long file, runs on
/// tokio's blocking pool, so the futures must be polled inside a tokio runtime. The rest is
/// done at once on the caller's thread, where it costs less than the hand-off to another
/// thread and back: an append that needs no sync and starts no run, to a journal that exists,
/// is still named by its path, ends with a complete line and whose lock is free (a write to
/// the page cache; see `jsonl/append.rs`); a read of a missing journal, or of one of at most
/// 64 KiB whose lock is free.
#[derive(Debug, Clone)]
pub struct JsonlStore {
    root: PathBuf,
    /// What the store keeps between operations.
    kept: Arc<Kept>,
}

/// What a store keeps between its operations: the sessions' offset indexes read or written
/// last (`offsets.rs`), and the events decoded last with their lines ([`Decoded`]).
#[derive(Debug, Default)]
pub(crate) struct Kept {
    pub(crate) offsets: OffsetsCache,
    pub(crate) decoded: Decoded,
    /// The group commit of the store's appends.
    pub(crate) group: GroupSync,
}

impl JsonlStore {
    /// A store rooted at `root` (created, with tenant directories, at the first append).
    pub fn new(root: impl Into<PathBuf>) -> JsonlStore {
        JsonlStore {
            root: root.into(),
            kept: Arc::default(),
        }
    }

    /// The directory holding the tenant directories.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl EventStore for JsonlStore {
    fn append(
        &self,
        batch: Vec<Event>,
        expected_last_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Event>, StoreError>> {
        Box::pin(async move {
            let batch = match Batch::check(batch)? {
                Ok(batch) => batch,
                Err(empty) => return Ok(empty),
            };
            let journal =
                Journal::new(&self.root, &self.kept, &batch.tenant_id, &batch.session_id)?;
            let batch = match journal.try_append_at_once(batch, expected_last_seq)? {
                AtOnce::Done(events) => {
                    // As for a read done at once (see `read`).
                    tokio::task::consume_budget().await;
                    return Ok(events);
                }
                AtOnce::Declined(batch) => batch,
            };
            let path = journal.path.clone();
            blocking(&path, move || journal.append(batch, expected_last_seq)).await
        })
    }

    fn read<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        Box::pin(async move {
            let events = self.read_shared(tenant_id, session_id, after_seq).await?;
            Ok(loom_core::ports::owned_events(events))
        })
    }

    fn read_shared<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        after_seq: u64,
    ) -> BoxFuture<'a, Result<Vec<Arc<Event>>, StoreError>> {
        Box::pin(async move {
            let journal = Journal::new(&self.root, &self.kept, tenant_id, session_id)?;
            read(journal, move |journal, file| journal.read(file, after_seq)).await
        })
    }

    fn last_seq<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let journal = Journal::new(&self.root, &self.kept, tenant_id, session_id)?;
            read(journal, |journal, file| {
                journal.summary(file).map(|s| s.map_or(0, |s| s.1.last_seq))
            })
            .await
        })
    }

    fn sessions<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SessionSummary>, StoreError>> {
        Box::pin(async move {
            safe_id("tenant", tenant_id)?;
            let root = self.root.clone();
            let tenant = tenant_id.to_owned();
            let dir = root.join(&tenant);
            let kept = Arc::clone(&self.kept);
            blocking(&dir, move || sessions_blocking(&root, &kept, &tenant)).await
        })
    }

    fn delete<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            safe_id("tenant", tenant_id)?;
            safe_id("session", session_id)?;
            let path = self
                .root
                .join(tenant_id)
                .join(format!("{session_id}.jsonl"));
            let corrupt = self
                .root
                .join(tenant_id)
                .join(format!("{session_id}.jsonl.corrupt"));
            let session = session_id.to_owned();
            // An erased journal leaves nothing of itself in memory either.
            self.kept.decoded.clear();
            blocking(&path.clone(), move || {
                let count = match std::fs::read_to_string(&path) {
                    Ok(text) => text.lines().filter(|l| !l.trim().is_empty()).count() as u64,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
                    Err(e) => {
                        return Err(StoreError::Io {
                            path: path.display().to_string(),
                            source: e,
                        });
                    }
                };
                std::fs::remove_file(&path).map_err(|e| StoreError::Io {
                    path: path.display().to_string(),
                    source: e,
                })?;
                let _ = std::fs::remove_file(&corrupt);
                let _ = std::fs::remove_file(index_path(&path));
                if let Some(dir) = path.parent()
                    && let Ok(directory) = std::fs::File::open(dir)
                {
                    let _ = directory.sync_all();
                    forget(
                        &crate::index::RunIndex::new(dir.to_path_buf()),
                        &path,
                        &session,
                    );
                }
                Ok(count)
            })
            .await
        })
    }

    fn find_run<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        Box::pin(async move {
            safe_id("tenant", tenant_id)?;
            if !loom_core::ids::is_safe_id(run_id) {
                return Ok(None);
            }
            let index = tenant_index(&self.root, tenant_id);
            let run = run_id.to_owned();
            let dir = self.root.join(tenant_id);
            blocking(&dir.clone(), move || {
                index
                    .find(&run)
                    .map_err(io_error(&dir.join(crate::index::INDEX_FILE)))
            })
            .await
        })
    }

    fn search<'a>(
        &'a self,
        filter: &'a loom_core::search::EventFilter,
    ) -> BoxFuture<'a, Result<Option<loom_core::search::Searched>, StoreError>> {
        Box::pin(async move {
            safe_id("tenant", &filter.tenant_id)?;
            if filter
                .session_id
                .as_deref()
                .is_some_and(|s| !loom_core::ids::is_safe_id(s))
            {
                return Ok(None);
            }
            let dir = self.root.join(&filter.tenant_id);
            let index = crate::search::SearchIndex::new(&filter.tenant_id, dir.clone());
            let filter = filter.clone();
            blocking(&dir.clone(), move || {
                index
                    .search(&filter)
                    .map_err(io_error(&dir.join(crate::search::SEARCH_DIR)))
            })
            .await
        })
    }

    fn run_start<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(async move {
            let journal = Journal::new(&self.root, &self.kept, tenant_id, session_id)?;
            let run = run_id.to_owned();
            read(journal, move |journal, file| journal.run_start(file, &run)).await
        })
    }

    fn last_of_type<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Event>, StoreError>> {
        Box::pin(async move {
            let found = self
                .last_of_type_shared(tenant_id, session_id, event_type, before_seq)
                .await?;
            Ok(found.map(Arc::unwrap_or_clone))
        })
    }

    fn last_of_type_shared<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        event_type: &'a str,
        before_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Arc<Event>>, StoreError>> {
        Box::pin(async move {
            let journal = Journal::new(&self.root, &self.kept, tenant_id, session_id)?;
            let kind = event_type.to_owned();
            read(journal, move |journal, file| {
                journal.last_of_type(file, &kind, before_seq)
            })
            .await
        })
    }

    fn salvage<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Salvage, StoreError>> {
        Box::pin(async move {
            let journal = Journal::new(&self.root, &self.kept, tenant_id, session_id)?;
            let path = journal.path.clone();
            blocking(&path, move || journal.salvage()).await
        })
    }

    fn set_aside<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
        lines: Vec<SetAside>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let journal = Journal::new(&self.root, &self.kept, tenant_id, session_id)?;
            let path = journal.path.clone();
            blocking(&path, move || journal.set_lines_aside(lines)).await
        })
    }
}

/// Tells the run index that `session`'s file `path` was deleted or rewritten (best effort: a
/// stale index is noticed anyway).
pub(crate) fn forget(index: &crate::index::RunIndex, path: &Path, session: &str) {
    if let Err(error) = index.forget(session) {
        warn!(path = %path.display(), %error, "could not update the run index");
    }
}

/// The largest journal file a read answers at once, on the caller's thread (64 KiB): a read
/// of it from the page cache costs less than the two thread hand-offs of the blocking pool.
const READ_AT_ONCE_BYTES: u64 = 64 * 1024;

/// Runs the read `op` on `journal`'s file, opened under its shared lock (`None` when the
/// journal does not exist): at once, on the caller's thread, when it cannot wait on anything
/// (no journal, or a file of at most [`READ_AT_ONCE_BYTES`] whose lock is free), else on the
/// blocking pool.
async fn read<T, F>(journal: Journal, op: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce(&Journal, Option<File>) -> Result<T, StoreError> + Send + 'static,
{
    let file = match journal.open_shared_at_once()? {
        AtOnceRead::Ready(file) => {
            let read = op(&journal, file);
            // Done without a hand-off, so without the yield one gave: counted against the
            // task's budget, a run of such reads still lets the task's neighbours run.
            tokio::task::consume_budget().await;
            return read;
        }
        AtOnceRead::Wait(file) => file,
    };
    let path = journal.path.clone();
    blocking(&path, move || {
        file.lock_shared().map_err(journal.io())?;
        op(&journal, Some(file))
    })
    .await
}

/// Runs `f` on the blocking pool.
async fn blocking<T, F>(path: &Path, f: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|err| StoreError::Io {
            path: path.display().to_string(),
            source: io::Error::other(err),
        })?
}

/// Wraps an IO error with its path.
pub(crate) fn io_error(path: &Path) -> impl Fn(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// What [`Journal::open_shared_at_once`] found.
enum AtOnceRead {
    /// The journal under its shared lock, `None` when it does not exist.
    Ready(Option<File>),
    /// Its lock could wait, or reading it could take long: the file, opened, for the
    /// blocking pool to lock and read.
    Wait(File),
}

/// One session journal file.
#[derive(Debug)]
pub(crate) struct Journal {
    pub(crate) tenant_id: String,
    pub(crate) session_id: String,
    pub(crate) path: PathBuf,
    /// What the store keeps between operations.
    pub(crate) kept: Arc<Kept>,
}

/// The end of a journal, found by reading it backwards.
#[derive(Debug, PartialEq)]
pub(crate) struct Tail {
    /// Length of the complete lines: up to and including the last `'\n'`.
    pub(crate) complete_len: u64,
    /// Offset and bytes (without the `'\n'`) of the last complete line.
    pub(crate) last_line: Option<(u64, Vec<u8>)>,
}

impl Journal {
    /// The journal of `(tenant, session)` under `root`, once both ids are known to be safe.
    fn new(
        root: &Path,
        kept: &Arc<Kept>,
        tenant_id: &str,
        session_id: &str,
    ) -> Result<Journal, StoreError> {
        safe_id("tenant", tenant_id)?;
        safe_id("session", session_id)?;
        Ok(Journal {
            kept: Arc::clone(kept),
            tenant_id: tenant_id.to_owned(),
            session_id: session_id.to_owned(),
            path: root
                .join(tenant_id)
                .join(format!("{session_id}.{EXTENSION}")),
        })
    }

    pub(crate) fn io(&self) -> impl Fn(io::Error) -> StoreError + '_ {
        io_error(&self.path)
    }

    pub(crate) fn corrupted(&self, line: usize, source: EventReadError) -> StoreError {
        StoreError::Corrupted {
            path: self.path.display().to_string(),
            line,
            source,
        }
    }

    /// Parses one complete line (without its `'\n'`) and checks it belongs to this journal.
    pub(crate) fn decode(&self, bytes: &[u8]) -> Result<Event, EventReadError> {
        self.decode_shared(bytes).map(Arc::unwrap_or_clone)
    }

    /// [`Journal::decode`], the event shared with the store's cache of events decoded last.
    pub(crate) fn decode_shared(&self, bytes: &[u8]) -> Result<Arc<Event>, EventReadError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|err| EventReadError::Json(format!("invalid UTF-8: {err}")))?;
        let decoded = &self.kept.decoded;
        let event = match decoded.get(text) {
            Some(event) => event,
            None => {
                let event = Arc::new(Event::from_json(text)?);
                decoded.put(text, &event);
                event
            }
        };
        let invalid = |reason: String| EventReadError::Invalid {
            event_id: event.event_id.clone(),
            seq: event.seq,
            reason,
        };
        if event.tenant_id != self.tenant_id || event.session_id != self.session_id {
            return Err(invalid(format!(
                "belongs to journal {}/{}",
                event.tenant_id, event.session_id
            )));
        }
        if event.seq == 0 {
            return Err(invalid("journaled without a seq".into()));
        }
        Ok(event)
    }

    /// Opens the file for reading under a shared lock (`None` when it does not exist).
    pub(crate) fn open_shared(&self) -> Result<Option<File>, StoreError> {
        let Some(file) = self.open_existing()? else {
            return Ok(None);
        };
        file.lock_shared().map_err(self.io())?;
        Ok(Some(file))
    }

    /// Opens the file for reading, unlocked (`None` when it does not exist).
    fn open_existing(&self) -> Result<Option<File>, StoreError> {
        match File::open(&self.path) {
            Ok(file) => Ok(Some(file)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(self.io()(err)),
        }
    }

    /// Opens the file for reading under a shared lock if that cannot wait: `Ready(None)` when
    /// it does not exist, `Ready(Some(file))` when it is at most [`READ_AT_ONCE_BYTES`] long and
    /// its lock is free, `Wait` otherwise (an append holds it, or it is longer).
    fn open_shared_at_once(&self) -> Result<AtOnceRead, StoreError> {
        let Some(file) = self.open_existing()? else {
            return Ok(AtOnceRead::Ready(None));
        };
        if file.metadata().map_err(self.io())?.len() > READ_AT_ONCE_BYTES {
            return Ok(AtOnceRead::Wait(file));
        }
        Ok(if self.locked_at_once(file.try_lock_shared())? {
            AtOnceRead::Ready(Some(file))
        } else {
            AtOnceRead::Wait(file)
        })
    }

    /// Whether a `try_lock` or `try_lock_shared` took the lock (`false`: another holds it).
    pub(crate) fn locked_at_once(
        &self,
        taken: Result<(), TryLockError>,
    ) -> Result<bool, StoreError> {
        match taken {
            Ok(()) => Ok(true),
            Err(TryLockError::WouldBlock) => Ok(false),
            Err(TryLockError::Error(err)) => Err(self.io()(err)),
        }
    }

    /// The file's mtime and summary (`None` when the file does not exist). `file` is the
    /// journal opened under its shared lock, `None` when it does not exist.
    fn summary(
        &self,
        file: Option<File>,
    ) -> Result<Option<(SystemTime, SessionSummary)>, StoreError> {
        let Some(mut file) = file else {
            return Ok(None);
        };
        let meta = file.metadata().map_err(self.io())?;
        let tail = scan_tail(&mut file, meta.len(), TAIL_CHUNK).map_err(self.io())?;
        if tail.complete_len < meta.len() {
            warn!(
                path = %self.path.display(),
                bytes = meta.len() - tail.complete_len,
                "journal ends with a torn line (interrupted write); ignoring it"
            );
        }
        let last = self.last_event(&mut file, &tail)?;
        let summary = SessionSummary {
            session_id: self.session_id.clone(),
            last_seq: last.as_ref().map_or(0, |event| event.seq),
            updated_at: last.map(|event| event.ts),
        };
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        Ok(Some((mtime, summary)))
    }

    /// The event on the last complete line, if any.
    fn last_event(&self, file: &mut File, tail: &Tail) -> Result<Option<Event>, StoreError> {
        let Some((offset, bytes)) = &tail.last_line else {
            return Ok(None);
        };
        match self.decode(bytes) {
            Ok(event) => Ok(Some(event)),
            Err(source) => {
                let line = line_number(file, *offset).map_err(self.io())?;
                Err(self.corrupted(line, source))
            }
        }
    }
}

fn sessions_blocking(
    root: &Path,
    kept: &Arc<Kept>,
    tenant_id: &str,
) -> Result<Vec<SessionSummary>, StoreError> {
    let dir = root.join(tenant_id);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(io_error(&dir)(err)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_error(&dir))?;
        let name = entry.file_name();
        let Some(session_id) = name
            .to_str()
            .and_then(|name| name.strip_suffix(".jsonl"))
            .filter(|session| loom_core::ids::is_safe_id(session))
        else {
            continue;
        };
        let journal = Journal::new(root, kept, tenant_id, session_id)?;
        match journal.open_shared().and_then(|file| journal.summary(file)) {
            Ok(Some(summary)) if summary.1.last_seq > 0 => found.push(summary),
            // Absent, or empty: created by an append that then met a conflict.
            Ok(_) => {}
            // One unreadable journal must not hide the others.
            Err(err) => warn!(error = %err, "skipping an unreadable journal in the session list"),
        }
    }
    found.sort_by(|(a_time, a), (b_time, b)| {
        b_time
            .cmp(a_time)
            .then_with(|| b.updated_at.cmp(&a.updated_at))
            .then_with(|| a.session_id.cmp(&b.session_id))
    });
    Ok(found.into_iter().map(|(_, summary)| summary).collect())
}

/// Syncs a directory, making the names it holds durable (a no-op where directories cannot be
/// opened as files).
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    if cfg!(unix) {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_error(dir))?;
    }
    Ok(())
}

/// The length of the complete lines of the first `len` bytes of `file`: `len` itself when they
/// end with a newline, which one byte read tells (every append ends so), else the length up to
/// the last newline (a torn tail, found by [`scan_tail`]).
pub(crate) fn complete_len<R: Read + Seek>(file: &mut R, len: u64) -> io::Result<u64> {
    let Some(last) = len.checked_sub(1) else {
        return Ok(0);
    };
    file.seek(SeekFrom::Start(last))?;
    let mut byte = [0u8; 1];
    file.read_exact(&mut byte)?;
    if byte[0] == b'\n' {
        return Ok(len);
    }
    Ok(scan_tail(file, len, TAIL_CHUNK)?.complete_len)
}

/// Finds the last complete line of the first `len` bytes of `file` by reading backwards from
/// the end, `chunk` bytes first, doubling at each step: the cost is that of the last line (plus
/// a torn tail), not of the file.
pub(crate) fn scan_tail<R: Read + Seek>(file: &mut R, len: u64, chunk: usize) -> io::Result<Tail> {
    // `buf` holds the bytes `[start, len)`.
    let mut start = len;
    let mut buf: Vec<u8> = Vec::new();
    let mut step = chunk.max(1) as u64;
    loop {
        if let Some(end) = buf.iter().rposition(|&b| b == b'\n') {
            let complete_len = start + end as u64 + 1;
            if let Some(before) = buf[..end].iter().rposition(|&b| b == b'\n') {
                let line = buf[before + 1..end].to_vec();
                return Ok(Tail {
                    complete_len,
                    last_line: Some((start + before as u64 + 1, line)),
                });
            }
            if start == 0 {
                buf.truncate(end);
                return Ok(Tail {
                    complete_len,
                    last_line: Some((0, buf)),
                });
            }
        } else if start == 0 {
            return Ok(Tail {
                complete_len: 0,
                last_line: None,
            });
        }
        let size = step.min(start);
        start -= size;
        let mut head = vec![0; usize::try_from(size).map_err(io::Error::other)?];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut head)?;
        head.extend_from_slice(&buf);
        buf = head;
        step = step.saturating_mul(2);
    }
}

/// The number (from 1) of the line starting at byte `offset`; only used to report corruption.
fn line_number<R: Read + Seek>(file: &mut R, offset: u64) -> io::Result<usize> {
    file.seek(SeekFrom::Start(0))?;
    let mut reader = BufReader::new(file.take(offset));
    let mut newlines = 0;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(newlines + 1);
        }
        newlines += buf.iter().filter(|&&b| b == b'\n').count();
        let consumed = buf.len();
        reader.consume(consumed);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::Cursor;

    use super::*;

    /// A reader that counts the bytes it hands out.
    struct Counting<'a>(Cursor<&'a [u8]>, usize);

    impl Read for Counting<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1 += n;
            Ok(n)
        }
    }

    impl Seek for Counting<'_> {
        fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
            self.0.seek(pos)
        }
    }

    /// The tail computed the slow way.
    fn naive(bytes: &[u8]) -> Tail {
        let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else {
            return Tail {
                complete_len: 0,
                last_line: None,
            };
        };
        let start = bytes[..end]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1);
        Tail {
            complete_len: end as u64 + 1,
            last_line: Some((start as u64, bytes[start..end].to_vec())),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_appends_are_synced_in_groups_and_all_read_back() {
        use loom_testkit::conformance::{event, started};
        let dir = tempfile::tempdir().unwrap();
        let store = JsonlStore::new(dir.path());
        // A tenant directory already there: the groups below hold the sessions' new files and
        // their directory.
        let first = vec![started("t", "s0", "r0", Default::default())];
        store.append(first, 0).await.unwrap();
        assert_eq!(
            store.kept.group.counts(),
            (1, 2),
            "file and its directory, apart"
        );
        let sessions = 40;
        let appends: Vec<_> = (1..=sessions)
            .map(|n| {
                let store = store.clone();
                tokio::spawn(async move {
                    let session = format!("s{n}");
                    let batch = vec![started("t", &session, &format!("r{n}"), Default::default())];
                    store.append(batch, 0).await
                })
            })
            .collect();
        for append in appends {
            assert_eq!(append.await.unwrap().unwrap().len(), 1);
        }
        let (groups, syncs) = store.kept.group.counts();
        assert!((2..=1 + sessions).contains(&groups), "{groups}");
        if cfg!(target_os = "linux") {
            // One `syncfs` per group of several callers, two syncs for a caller alone.
            assert!(
                (groups + 1..=2 * groups).contains(&syncs),
                "{groups}, {syncs}"
            );
        }
        for n in 0..=sessions {
            let read = store.read("t", &format!("s{n}"), 0).await.unwrap();
            assert_eq!(read.len(), 1, "s{n}");
        }
        // A batch nothing outside depends on, to an existing file, is not synced at all.
        store
            .append(vec![event("t", "s0", "step")], 1)
            .await
            .unwrap();
        assert_eq!(store.kept.group.counts(), (groups, syncs));
    }

    #[test]
    fn tail_scan_matches_the_naive_scan_for_every_chunk_size() {
        let long = "x".repeat(40);
        let cases: Vec<String> = vec![
            String::new(),
            "\n".into(),
            "\n\n".into(),
            "abc".into(),
            "abc\n".into(),
            "abc\ndef\n".into(),
            "abc\ndef".into(),
            "abc\ndef\ngh".into(),
            format!("{long}\n{long}\n"),
            format!("a\n{long}\n{long}"),
            format!("{long}{long}\n"),
            format!("{long}"),
        ];
        for case in &cases {
            for chunk in [1, 2, 3, 5, 8, 13, 64, TAIL_CHUNK] {
                let mut cursor = Cursor::new(case.as_bytes());
                let tail = scan_tail(&mut cursor, case.len() as u64, chunk).unwrap();
                assert_eq!(tail, naive(case.as_bytes()), "case {case:?}, chunk {chunk}");
            }
        }
    }

    #[test]
    fn tail_scan_reads_little_of_a_large_file() {
        let file = "some line of a journal\n".repeat(100_000);
        let mut reader = Counting(Cursor::new(file.as_bytes()), 0);
        let tail = scan_tail(&mut reader, file.len() as u64, 64).unwrap();
        assert_eq!(tail, naive(file.as_bytes()));
        assert!(reader.1 <= 64, "read {} bytes", reader.1);
    }

    #[test]
    fn complete_len_is_that_of_the_scan_and_reads_one_byte_of_a_whole_file() {
        let long = "x".repeat(100);
        let cases = [
            String::new(),
            "\n".into(),
            "abc".into(),
            "abc\n".into(),
            "abc\ndef\ngh".into(),
            format!("{long}\n{long}\n"),
            format!("a\n{long}\n{long}"),
            long.clone(),
        ];
        for case in &cases {
            let mut cursor = Cursor::new(case.as_bytes());
            let len = complete_len(&mut cursor, case.len() as u64).unwrap();
            assert_eq!(len, naive(case.as_bytes()).complete_len, "case {case:?}");
        }
        // A file that ends with a newline: its last byte is all that is read.
        let file = format!("{{\"a\":\"{}\"}}\n", "y".repeat(50_000)).repeat(3);
        let mut reader = Counting(Cursor::new(file.as_bytes()), 0);
        assert_eq!(
            complete_len(&mut reader, file.len() as u64).unwrap(),
            file.len() as u64
        );
        assert_eq!(reader.1, 1);
    }

    #[test]
    fn line_numbers_count_from_one() {
        let mut cursor = Cursor::new(b"a\nbb\nccc\n".as_slice());
        assert_eq!(line_number(&mut cursor, 0).unwrap(), 1);
        assert_eq!(line_number(&mut cursor, 2).unwrap(), 2);
        assert_eq!(line_number(&mut cursor, 5).unwrap(), 3);
    }
}
