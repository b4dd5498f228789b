//! Reading a JSONL journal through its offset index (`offsets.rs`): `read(after_seq)` from the
//! first line it returns, the last event of a type before a seq, and where a run starts. Each
//! decodes only the lines it returns (plus one line to check an offset when its end does not
//! say its seq); a stale index is rebuilt from the file and the operation tried once more, and
//! when even a fresh index does not lead to the line, the journal is read from its start.

use std::{
    fs::File,
    io::{self, BufRead, BufReader, Read, Seek, SeekFrom},
    sync::Arc,
};

use loom_core::{event::Event, ports::StoreError};
use tracing::{debug, warn};

use crate::{
    index::{FileId, envelope_hint, file_id},
    jsonl::{Journal, complete_len},
    offsets::{COMPACT_EVERY, End, INDEX_FROM, MARKED, Offsets, index_path, seq_hint},
};

/// What an operation found with an index: its answer, or that the index led it astray.
enum Found<T> {
    Done(T),
    Stale,
}

impl Journal {
    /// The index of `file` (the journal opened, locked), up to date with its complete lines
    /// (`complete_len`): the copy this store kept or, failing that, its `.idx` file, checked,
    /// caught up with what was written since, or rebuilt (and then saved, best effort).
    pub(crate) fn offsets(
        &self,
        file: &mut File,
        complete_len: u64,
    ) -> Result<Arc<Offsets>, StoreError> {
        let id = file_id(&file.metadata().map_err(self.io())?);
        let path = index_path(&self.path);
        let mut found = None;
        if let Some(kept) = self.kept.offsets.get(&path)
            && self.valid(file, &kept, id, complete_len)?
        {
            found = Some(kept);
        }
        let was_kept = found.is_some();
        if found.is_none() {
            let loaded = Offsets::load(&path).unwrap_or_else(|error| {
                warn!(path = %path.display(), %error, "the offset index cannot be read: rebuilding it");
                None
            });
            match loaded {
                Some(offsets) if self.valid(file, &offsets, id, complete_len)? => {
                    found = Some(Arc::new(offsets));
                }
                Some(_) => {
                    debug!(path = %path.display(), "the offset index is stale: rebuilding it")
                }
                None => {}
            }
        }
        let fresh = found.is_none();
        let mut offsets = found.unwrap_or_else(|| Arc::new(Offsets::new(id)));
        let grown = complete_len > offsets.end.len
            && Arc::make_mut(&mut offsets)
                .scan(file, complete_len)
                .map_err(self.io())?;
        if grown || fresh {
            self.save(&offsets);
        }
        if grown || !was_kept {
            self.kept.offsets.put(&path, Arc::clone(&offsets));
        }
        Ok(offsets)
    }

    /// Whether `offsets` describes `file` (identity `id`) and still holds for it.
    fn valid(
        &self,
        file: &mut File,
        offsets: &Offsets,
        id: FileId,
        complete_len: u64,
    ) -> Result<bool, StoreError> {
        Ok(offsets.file == id
            && self
                .holds(file, offsets.end, complete_len)
                .map_err(self.io())?)
    }

    /// The index of `file` rebuilt from its start.
    fn rebuilt(&self, file: &mut File, complete_len: u64) -> Result<Arc<Offsets>, StoreError> {
        let id = file_id(&file.metadata().map_err(self.io())?);
        let mut offsets = Offsets::new(id);
        offsets.scan(file, complete_len).map_err(self.io())?;
        self.save(&offsets);
        let offsets = Arc::new(offsets);
        self.kept
            .offsets
            .put(&index_path(&self.path), Arc::clone(&offsets));
        Ok(offsets)
    }

    /// Saves `offsets` as the journal's index (best effort: it is a cache), once the journal
    /// is [`INDEX_FROM`] bytes long: a shorter one is read whole faster than an index file is
    /// created (a new file per session was the most expensive part of a one-run session's
    /// append, the filesystem looking for a free inode), and its index is rebuilt, from the
    /// file, by the reader that needs it.
    fn save(&self, offsets: &Offsets) {
        if offsets.end.len < INDEX_FROM {
            return;
        }
        let path = index_path(&self.path);
        if let Err(error) = offsets.save(&path) {
            warn!(path = %path.display(), %error, "could not write the offset index");
        }
    }

    /// Whether the file still ends its indexed part where `end` says: at least that long, and
    /// the last line indexed starts at its offset and carries its seq.
    fn holds(&self, file: &mut File, end: End, complete_len: u64) -> io::Result<bool> {
        if end.seq == 0 {
            return Ok(end.len == 0 && end.offset == 0);
        }
        if end.len > complete_len || end.offset >= end.len {
            return Ok(false);
        }
        Ok(self
            .line_at(file, end.offset, end.len)?
            .is_some_and(|line| {
                line.len() as u64 + 1 == end.len - end.offset && self.is_line(&line, end.seq)
            }))
    }

    /// Whether `line` is line `seq`: by the seq its end names, else decoded.
    fn is_line(&self, line: &[u8], seq: u64) -> bool {
        match seq_hint(line) {
            Some(found) => found == seq,
            None => self.decode(line).is_ok_and(|event| event.seq == seq),
        }
    }

    /// The complete line starting at `offset` (without its newline), reading no further than
    /// `limit`; `None` when no line starts there.
    fn line_at(&self, file: &mut File, offset: u64, limit: u64) -> io::Result<Option<Vec<u8>>> {
        if offset >= limit {
            return Ok(None);
        }
        if offset > 0 {
            let mut before = [0u8; 1];
            file.seek(SeekFrom::Start(offset - 1))?;
            file.read_exact(&mut before)?;
            if before[0] != b'\n' {
                return Ok(None);
            }
        } else {
            file.seek(SeekFrom::Start(0))?;
        }
        let mut line = Vec::new();
        BufReader::new(file.take(limit - offset)).read_until(b'\n', &mut line)?;
        if line.pop() != Some(b'\n') {
            return Ok(None);
        }
        Ok(Some(line))
    }

    /// Whether the line at `offset` is line `seq` (line 1 is at 0 by definition).
    fn carries(&self, file: &mut File, offset: u64, seq: u64, limit: u64) -> io::Result<bool> {
        if (seq, offset) == (1, 0) {
            return Ok(true);
        }
        Ok(self
            .line_at(file, offset, limit)?
            .is_some_and(|line| self.is_line(&line, seq)))
    }

    /// Runs `attempt` with the journal's index, then once more with an index rebuilt from the
    /// file if the first led it astray; `None` if the rebuilt one did too.
    fn with_offsets<T>(
        &self,
        file: &mut File,
        complete_len: u64,
        mut attempt: impl FnMut(&Journal, &mut File, &Offsets) -> Result<Found<T>, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        let offsets = self.offsets(file, complete_len)?;
        if let Found::Done(found) = attempt(self, file, &offsets)? {
            return Ok(Some(found));
        }
        debug!(path = %self.path.display(), "the offset index led astray: rebuilding it");
        let offsets = self.rebuilt(file, complete_len)?;
        match attempt(self, file, &offsets)? {
            Found::Done(found) => Ok(Some(found)),
            Found::Stale => Ok(None),
        }
    }

    /// Events with `seq > after`: from the first line after `after` when the index knows where
    /// it is (only the lines returned are decoded), else from the start of the file.
    /// `file` is the journal opened under its shared lock, `None` when it does not exist.
    pub(crate) fn read(
        &self,
        file: Option<File>,
        after: u64,
    ) -> Result<Vec<Arc<Event>>, StoreError> {
        let Some(mut file) = file else {
            return Ok(Vec::new());
        };
        if after == 0 {
            return self.read_from(&mut file, (1, 0), 0);
        }
        let len = file.metadata().map_err(self.io())?.len();
        let complete_len = complete_len(&mut file, len).map_err(self.io())?;
        let found = self.with_offsets(&mut file, complete_len, |journal, file, offsets| {
            if after >= offsets.end.seq {
                return Ok(Found::Done(Vec::new()));
            }
            let (seq, offset) = offsets.before(after + 1);
            if !journal
                .carries(file, offset, seq, complete_len)
                .map_err(journal.io())?
            {
                return Ok(Found::Stale);
            }
            journal
                .read_from(file, (seq, offset), after)
                .map(Found::Done)
        })?;
        match found {
            Some(events) => Ok(events),
            None => self.read_from(&mut file, (1, 0), after),
        }
    }

    /// The events of the complete lines from `start` (`(seq, offset)` of a line) with
    /// `seq > after`, each checked; the lines before them are skipped unread. A torn last line
    /// is ignored.
    fn read_from(
        &self,
        file: &mut File,
        (seq, offset): (u64, u64),
        after: u64,
    ) -> Result<Vec<Arc<Event>>, StoreError> {
        file.seek(SeekFrom::Start(offset)).map_err(self.io())?;
        let mut reader = BufReader::with_capacity(64 * 1024, file);
        let mut events = Vec::new();
        let mut line = Vec::new();
        let mut line_no = seq - 1;
        loop {
            line.clear();
            let read = reader.read_until(b'\n', &mut line).map_err(self.io())?;
            if read == 0 {
                break;
            }
            if line.pop() != Some(b'\n') {
                warn!(
                    path = %self.path.display(),
                    bytes = read,
                    "journal ends with a torn line (interrupted write); ignoring it"
                );
                break;
            }
            line_no += 1;
            if line_no <= after {
                continue;
            }
            let event = self
                .line_event_shared(&line, line_no)
                .map_err(|source| self.corrupted(line_number(line_no), source))?;
            events.push(event);
        }
        Ok(events)
    }

    /// The last event whose envelope's type is `kind` with `seq < before`: a marked type from
    /// the index's marks, any other by reading the file backwards from `before`, a stretch of
    /// lines between two checkpoints at a time. Only the line returned is decoded.
    /// `file` as for [`Journal::read`].
    pub(crate) fn last_of_type(
        &self,
        file: Option<File>,
        kind: &str,
        before: u64,
    ) -> Result<Option<Arc<Event>>, StoreError> {
        let Some(mut file) = file else {
            return Ok(None);
        };
        let len = file.metadata().map_err(self.io())?.len();
        let complete_len = complete_len(&mut file, len).map_err(self.io())?;
        let marked = MARKED.contains(&kind);
        let found = self.with_offsets(&mut file, complete_len, |journal, file, offsets| {
            if marked {
                journal.last_marked(file, offsets, kind, before, complete_len)
            } else {
                journal.last_scanned(file, offsets, kind, before, complete_len)
            }
        })?;
        match found {
            Some(found) => Ok(found),
            // Not even a fresh index leads to it: read the journal (its corruption named).
            None => Ok(self
                .read_from(&mut file, (1, 0), 0)?
                .into_iter()
                .rev()
                .find(|e| e.seq < before && e.event_type == kind)),
        }
    }

    /// [`Journal::last_of_type`] of a marked type.
    fn last_marked(
        &self,
        file: &mut File,
        offsets: &Offsets,
        kind: &str,
        before: u64,
        complete_len: u64,
    ) -> Result<Found<Option<Arc<Event>>>, StoreError> {
        let Some(mark) = offsets
            .marks
            .iter()
            .rev()
            .find(|m| m.kind == kind && m.seq < before)
        else {
            return Ok(Found::Done(None));
        };
        let Some(line) = self
            .line_at(file, mark.offset, complete_len)
            .map_err(self.io())?
        else {
            return Ok(Found::Stale);
        };
        match self.decode_shared(&line) {
            Ok(event) if event.seq == mark.seq && event.event_type == kind => {
                Ok(Found::Done(Some(event)))
            }
            Ok(_) => Ok(Found::Stale),
            // The line is the one marked, and does not read back: the journal is corrupted.
            Err(source)
                if seq_hint(&line) == Some(mark.seq)
                    && envelope_hint(&line).is_some_and(|(found, _)| found == kind) =>
            {
                Err(self.corrupted(line_number(mark.seq), source))
            }
            Err(_) => Ok(Found::Stale),
        }
    }

    /// [`Journal::last_of_type`] of a type the index does not mark.
    fn last_scanned(
        &self,
        file: &mut File,
        offsets: &Offsets,
        kind: &str,
        before: u64,
        complete_len: u64,
    ) -> Result<Found<Option<Arc<Event>>>, StoreError> {
        let last = offsets.end.seq.min(before.saturating_sub(1));
        if last == 0 {
            return Ok(Found::Done(None));
        }
        // Stretches `[start, up_to]` of lines, from the one holding `last` backwards.
        let mut up_to = last;
        loop {
            let (start, offset) = offsets.before(up_to);
            if !self
                .carries(file, offset, start, complete_len)
                .map_err(self.io())?
            {
                return Ok(Found::Stale);
            }
            file.seek(SeekFrom::Start(offset)).map_err(self.io())?;
            let mut reader = BufReader::with_capacity(64 * 1024, file.take(complete_len - offset));
            let mut found = None;
            let mut line = Vec::new();
            for seq in start..=up_to {
                line.clear();
                if reader.read_until(b'\n', &mut line).map_err(self.io())? == 0
                    || line.pop() != Some(b'\n')
                {
                    return Ok(Found::Stale);
                }
                if envelope_hint(&line).is_some_and(|(found, _)| found == kind) {
                    found = Some((seq, line.clone()));
                }
            }
            if let Some((seq, line)) = found {
                let event = self
                    .line_event_shared(&line, seq)
                    .map_err(|source| self.corrupted(line_number(seq), source))?;
                return Ok(Found::Done(Some(event)));
            }
            if start <= 1 {
                return Ok(Found::Done(None));
            }
            up_to = start - 1;
        }
    }

    /// The seq of the `run.started` of `run_id` in this journal, from the index's marks (its
    /// line checked to be that run's start); `None` when the journal has none.
    /// `file` as for [`Journal::read`].
    pub(crate) fn run_start(
        &self,
        file: Option<File>,
        run_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        let Some(mut file) = file else {
            return Ok(None);
        };
        let len = file.metadata().map_err(self.io())?.len();
        let complete_len = complete_len(&mut file, len).map_err(self.io())?;
        let found = self.with_offsets(&mut file, complete_len, |journal, file, offsets| {
            let Some(mark) = offsets
                .marks
                .iter()
                .rev()
                .find(|m| m.kind == "run.started" && m.run == run_id)
            else {
                return Ok(Found::Done(None));
            };
            let Some(line) = journal
                .line_at(file, mark.offset, complete_len)
                .map_err(journal.io())?
            else {
                return Ok(Found::Stale);
            };
            let starts = envelope_hint(&line) == Some(("run.started", run_id));
            Ok(if starts && journal.is_line(&line, mark.seq) {
                Found::Done(Some(mark.seq))
            } else {
                Found::Stale
            })
        })?;
        // A hint: when even a fresh index does not say, the reader starts from the beginning.
        Ok(found.flatten())
    }

    /// Brings the index up to date after an append of `lines` (each line's bytes, newline
    /// included), the journal having ended at `before` (its last line): the entries are
    /// appended to the index when it ends exactly there. Otherwise, when `catch_up`, the index
    /// is caught up or rebuilt from the file; when not (an append done at once, which must not
    /// read a whole index or journal on the caller's thread), the copy this store keeps takes
    /// the entries and is saved when it ended at `before`, else it is dropped and the `.idx`
    /// file left behind, for the next reader to catch up. A journal
    /// under [`INDEX_FROM`] has no index file: only the kept copy takes the entries, when it
    /// ended at `before`. Best effort: the batch is durable already.
    pub(crate) fn index_append(
        &self,
        file: &mut File,
        before: End,
        lines: &[&[u8]],
        catch_up: bool,
    ) {
        let mut offsets = Offsets::new(file.metadata().map(|m| file_id(&m)).unwrap_or_default());
        offsets.end = before;
        let mut entries = String::new();
        let mut offset = before.len;
        for (seq, line) in (before.seq + 1..).zip(lines) {
            offsets.push_line(seq, offset, line, line.len() as u64, &mut entries);
            offset += line.len() as u64;
        }
        let path = index_path(&self.path);
        if offset < INDEX_FROM {
            // A journal this short has no index file (`save`): the copy this store keeps takes
            // the batch's entries when it ended where the batch began, else the next reader
            // rebuilds it from the file, short. No file is opened for it.
            self.kept.offsets.extend(&path, before, &offsets);
            return;
        }
        let crossed = before.seq / COMPACT_EVERY != offsets.end.seq / COMPACT_EVERY;
        entries.push_str(&offsets.end_line());
        let appended = !crossed
            && Offsets::append_if_at(&path, offsets.file, before, &entries).unwrap_or_else(
                |error| {
                    warn!(path = %path.display(), %error, "could not append to the offset index");
                    false
                },
            );
        if appended {
            self.kept.offsets.extend(&path, before, &offsets);
            return;
        }
        if !catch_up {
            // Without reading anything: the kept copy, when it ended where the batch began,
            // takes its entries and is saved (a journal passing 16 KiB, a compaction);
            // otherwise it is dropped and the next reader catches the index up.
            if let Some(extended) = self.kept.offsets.extend(&path, before, &offsets) {
                self.save(&extended);
            }
            return;
        }
        if let Err(error) = self.offsets(file, offset) {
            warn!(path = %path.display(), %error, "could not bring the offset index up to date");
        }
    }
}

/// A line number as [`StoreError::Corrupted`] names it.
fn line_number(seq: u64) -> usize {
    usize::try_from(seq).unwrap_or(usize::MAX)
}
