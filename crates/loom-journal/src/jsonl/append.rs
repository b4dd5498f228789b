//! Appending to a session's JSONL file: under its exclusive lock, after checking the expected
//! last seq, with the syncs the batch needs made in the store's group commit (`group.rs`);
//! an append that needs none is written at once, on the caller's thread, when nothing could
//! make it wait ([`Journal::try_append_at_once`]).

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Read, Seek, SeekFrom, Write},
    path::Path,
};

use loom_core::{
    event::{Event, must_sync},
    journal::{Batch, conflict},
    ports::StoreError,
};
use tracing::warn;

use super::{Journal, REOPEN_ATTEMPTS, TAIL_CHUNK, Tail, io_error, scan_tail, sync_dir};
use crate::{group::ToSync, index::file_id, offsets::End};

/// On which thread an append runs, which decides how much it may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// At once, on the caller's thread: nothing read beyond the journal's tail.
    AtOnce,
    /// On the blocking pool: the offset index may be caught up or rebuilt from the file.
    Waiting,
}

/// What [`Journal::try_append_at_once`] did.
#[derive(Debug)]
pub(crate) enum AtOnce {
    /// The batch is appended: the events as journaled.
    Done(Vec<Event>),
    /// The append could wait: the batch, untouched, for the blocking pool.
    Declined(Batch),
}

impl Journal {
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
            if self.still_named(&file)?.is_some() {
                return Ok(file);
            }
        }
        Err(self.io()(io::Error::other(
            "the journal file kept being replaced while waiting for its lock",
        )))
    }

    /// The length of `file` if the journal's path still names it (`None` when a repair has
    /// renamed another file over it, or deleted it).
    fn still_named(&self, file: &File) -> Result<Option<u64>, StoreError> {
        let held = file.metadata().map_err(self.io())?;
        match fs::metadata(&self.path) {
            Ok(meta) => Ok((file_id(&meta) == file_id(&held)).then_some(held.len())),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(self.io()(err)),
        }
    }

    /// Appends `batch` at once, on the caller's thread, when that cannot wait for a sync or for
    /// a lock another holds: the batch needs no sync ([`must_sync`]) and starts no run, the
    /// journal exists, is still named by its path, ends with a complete line, and its lock is
    /// free. Nothing is read beyond the journal's tail: an offset index that does not end where
    /// the batch begins is left for the next reader to catch up. An append that needs no sync
    /// is a write to the OS's page cache, so handing it to the blocking pool (a thread woken,
    /// then the runtime woken back) would cost more than the append itself. Anything else gives the batch back untouched, for
    /// [`Journal::append`] on the blocking pool: a sync, a new file (its directory entry is
    /// synced), a torn last line (set aside and synced), a lock held by another append (which
    /// may be waiting for its group's sync) or by a reader.
    pub(crate) fn try_append_at_once(
        &self,
        batch: Batch,
        expected: u64,
    ) -> Result<AtOnce, StoreError> {
        // A run's start is always synced (`SYNCED_TYPES`); said here too because it also
        // takes the tenant's run index, under a lock of its own that could wait.
        if must_sync(batch.events())
            || batch
                .events()
                .iter()
                .any(|event| event.event_type == "run.started")
        {
            return Ok(AtOnce::Declined(batch));
        }
        let mut file = match OpenOptions::new().read(true).write(true).open(&self.path) {
            Ok(file) => file,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                return Ok(AtOnce::Declined(batch));
            }
            Err(err) => return Err(self.io()(err)),
        };
        if !self.locked_at_once(file.try_lock())? {
            return Ok(AtOnce::Declined(batch));
        }
        let Some(len) = self.still_named(&file)? else {
            return Ok(AtOnce::Declined(batch));
        };
        let tail = scan_tail(&mut file, len, TAIL_CHUNK).map_err(self.io())?;
        if tail.complete_len == 0 || tail.complete_len < len {
            return Ok(AtOnce::Declined(batch));
        }
        self.append_locked(file, len, tail, batch, expected, Mode::AtOnce)
            .map(AtOnce::Done)
    }

    /// Appends `batch` after `expected`, under the exclusive lock, waiting for it.
    pub(crate) fn append(&self, batch: Batch, expected: u64) -> Result<Vec<Event>, StoreError> {
        let mut file = self.open_locked()?;
        let len = file.metadata().map_err(self.io())?.len();
        let tail = scan_tail(&mut file, len, TAIL_CHUNK).map_err(self.io())?;
        self.append_locked(file, len, tail, batch, expected, Mode::Waiting)
    }

    /// Appends `batch` after `expected` to `file`, locked, `len` bytes long and ending with
    /// `tail`.
    fn append_locked(
        &self,
        mut file: File,
        len: u64,
        tail: Tail,
        mut batch: Batch,
        expected: u64,
        mode: Mode,
    ) -> Result<Vec<Event>, StoreError> {
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
        if must_sync(batch.events()) {
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
        self.index_append(&mut file, before, &written, mode == Mode::Waiting);
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
        self.keep_aside(&torn)?;
        file.set_len(complete_len)
            .and_then(|()| file.sync_data())
            .map_err(self.io())?;
        warn!(
            path = %self.path.display(),
            bytes = len - complete_len,
            moved_to = %self.aside_path().display(),
            "journal ended with a torn line (interrupted write); moved it aside"
        );
        Ok(())
    }
}
