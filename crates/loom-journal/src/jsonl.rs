//! The JSONL store: one append-only file per session.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write},
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
    group::{GroupSync, ToSync},
    index::{file_id, tenant_index},
    offsets::{End, OffsetsCache, index_path},
};

use loom_core::journal::{Batch, Decoded, conflict, safe_id};

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
/// All file IO runs on tokio's blocking pool, so the futures must be polled inside a tokio
/// runtime.
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
        let root = self.root.clone();
        let kept = Arc::clone(&self.kept);
        Box::pin(async move {
            let where_ = root.clone();
            blocking(&where_, move || {
                append_blocking(&root, &kept, batch, expected_last_seq)
            })
            .await
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
            let path = journal.path.clone();
            blocking(&path, move || journal.read(after_seq)).await
        })
    }

    fn last_seq<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let journal = Journal::new(&self.root, &self.kept, tenant_id, session_id)?;
            let path = journal.path.clone();
            blocking(&path, move || {
                journal.summary().map(|s| s.map_or(0, |s| s.1.last_seq))
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
            let path = journal.path.clone();
            let run = run_id.to_owned();
            blocking(&path, move || journal.run_start(&run)).await
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
            let path = journal.path.clone();
            let kind = event_type.to_owned();
            blocking(&path, move || journal.last_of_type(&kind, before_seq)).await
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
        let file = match File::open(&self.path) {
            Ok(file) => file,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(self.io()(err)),
        };
        file.lock_shared().map_err(self.io())?;
        Ok(Some(file))
    }

    /// The file's mtime and summary (`None` when the file does not exist).
    fn summary(&self) -> Result<Option<(SystemTime, SessionSummary)>, StoreError> {
        let Some(mut file) = self.open_shared()? else {
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

    /// Opens the file for appending, creating it (and its tenant directory) when missing.
    fn open_for_append(&self) -> Result<File, StoreError> {
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.path)
        };
        match open() {
            Ok(file) => Ok(file),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                let Some(dir) = self.path.parent() else {
                    return Err(self.io()(err));
                };
                let root = dir.parent().unwrap_or(Path::new("."));
                fs::create_dir_all(root).map_err(io_error(root))?;
                match fs::create_dir(dir) {
                    // A new tenant directory: make its name durable in the root.
                    Ok(()) => sync_dir(root)?,
                    Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(err) => return Err(io_error(dir)(err)),
                }
                open().map_err(self.io())
            }
            Err(err) => Err(self.io()(err)),
        }
    }

    /// Opens the file for appending under its exclusive lock, making sure the file locked is
    /// still the journal (a repair renames a new file over it: an appender that waited for the
    /// old one's lock opens the new one).
    pub(crate) fn open_locked(&self) -> Result<File, StoreError> {
        for _ in 0..REOPEN_ATTEMPTS {
            let file = self.open_for_append()?;
            file.lock().map_err(self.io())?;
            let locked = file_id(&file.metadata().map_err(self.io())?);
            match fs::metadata(&self.path) {
                Ok(meta) if file_id(&meta) == locked => return Ok(file),
                Ok(_) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(self.io()(err)),
            }
        }
        Err(self.io()(io::Error::other(
            "the journal file kept being replaced while waiting for its lock",
        )))
    }

    /// Appends `batch` after `expected`, under the exclusive lock.
    fn append(&self, mut batch: Batch, expected: u64) -> Result<Vec<Event>, StoreError> {
        let mut file = self.open_locked()?;
        let len = file.metadata().map_err(self.io())?.len();
        let tail = scan_tail(&mut file, len, TAIL_CHUNK).map_err(self.io())?;
        let last = self
            .last_event(&mut file, &tail)?
            .map_or(0, |event| event.seq);
        if last != expected {
            return Err(conflict(&self.tenant_id, &self.session_id, expected, last));
        }
        if tail.complete_len < len {
            self.set_aside(&mut file, tail.complete_len, len)?;
        }
        batch.assign_seq(last);
        let mut lines = String::with_capacity(
            batch
                .lines()
                .iter()
                .map(|line| line.as_str().len() + 1)
                .sum(),
        );
        // Where each line ends in `lines`, for the offset index.
        let mut ends = Vec::with_capacity(batch.len());
        // Runs started by the batch, with the offset of their line, for the run index.
        let mut started = Vec::new();
        for (event, line) in batch.events().iter().zip(batch.lines()) {
            // By the envelope's type: a sealed payload (`loom-crypto`) keeps it clear.
            if event.event_type == "run.started" {
                started.push((event.run_id.clone(), tail.complete_len + lines.len() as u64));
            }
            lines.push_str(line.as_str());
            lines.push('\n');
            ends.push(lines.len());
        }
        // What must be durable before the append returns: the journal when the batch holds an
        // event something outside depends on, the directory entry of a new file. Synced in
        // the store's next group commit (`group.rs`), the file's lock held meanwhile.
        let mut to_sync = Vec::new();
        if loom_core::event::must_sync(batch.events()) {
            let own = file.try_clone().map_err(self.io())?;
            to_sync.push(ToSync {
                file: own,
                directory: false,
            });
        }
        if tail.complete_len == 0
            && cfg!(unix)
            && let Some(dir) = self.path.parent()
        {
            let directory = File::open(dir).map_err(io_error(dir))?;
            to_sync.push(ToSync {
                file: directory,
                directory: true,
            });
        }
        self.write_at_end(&mut file, tail.complete_len, lines.as_bytes(), to_sync)?;
        // The batch is written (and durable when it had to be): the offset index follows (a
        // cache, not synced).
        let before = End {
            seq: last,
            offset: tail.last_line.as_ref().map_or(0, |(offset, _)| *offset),
            len: tail.complete_len,
        };
        let mut start = 0;
        let written: Vec<&[u8]> = ends
            .iter()
            .map(|&end| {
                let line = &lines.as_bytes()[start..end];
                start = end;
                line
            })
            .collect();
        self.index_append(&mut file, before, &written);
        if let Some(dir) = self.path.parent()
            && let Err(error) =
                crate::index::RunIndex::new(dir.to_path_buf()).add(&self.session_id, &started)
        {
            warn!(path = %self.path.display(), %error, "could not update the run index");
        }
        Ok(batch.into_parts().0)
    }

    /// Writes `bytes` at `base` (the end of the file), then makes `to_sync` durable in the
    /// store's group commit (a sync of the file covers every earlier write of it), truncating
    /// back to `base` if anything fails.
    fn write_at_end(
        &self,
        file: &mut File,
        base: u64,
        bytes: &[u8],
        to_sync: Vec<ToSync>,
    ) -> Result<(), StoreError> {
        let result = file
            .seek(SeekFrom::Start(base))
            .and_then(|_| file.write_all(bytes))
            .and_then(|()| self.kept.group.sync(to_sync));
        if let Err(err) = result {
            if let Err(undo) = file.set_len(base).and_then(|()| file.sync_data()) {
                warn!(
                    path = %self.path.display(),
                    error = %undo,
                    "could not truncate the journal back after a failed write"
                );
            }
            return Err(self.io()(err));
        }
        Ok(())
    }

    /// Moves the torn bytes `[complete_len, len)` to `<session>.jsonl.corrupt` (appended, then
    /// synced) and truncates the journal to its last complete line.
    fn set_aside(&self, file: &mut File, complete_len: u64, len: u64) -> Result<(), StoreError> {
        let mut torn = Vec::new();
        file.seek(SeekFrom::Start(complete_len))
            .and_then(|_| file.take(len - complete_len).read_to_end(&mut torn))
            .map_err(self.io())?;
        torn.push(b'\n');
        let aside = self.path.with_extension(format!("{EXTENSION}.corrupt"));
        let mut out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&aside)
            .map_err(io_error(&aside))?;
        let was_empty = out.metadata().map_err(io_error(&aside))?.len() == 0;
        out.write_all(&torn)
            .and_then(|()| out.sync_data())
            .map_err(io_error(&aside))?;
        if was_empty && let Some(dir) = aside.parent() {
            sync_dir(dir)?;
        }
        file.set_len(complete_len)
            .and_then(|()| file.sync_data())
            .map_err(self.io())?;
        warn!(
            path = %self.path.display(),
            bytes = len - complete_len,
            moved_to = %aside.display(),
            "journal ended with a torn line (interrupted write); moved it aside"
        );
        Ok(())
    }
}

fn append_blocking(
    root: &Path,
    kept: &Arc<Kept>,
    batch: Vec<Event>,
    expected: u64,
) -> Result<Vec<Event>, StoreError> {
    let batch = match Batch::check(batch)? {
        Ok(batch) => batch,
        Err(empty) => return Ok(empty),
    };
    Journal::new(root, kept, &batch.tenant_id, &batch.session_id)?.append(batch, expected)
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
        match journal.summary() {
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
