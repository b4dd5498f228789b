//! The offset index of one JSONL session file: `<session>.jsonl.idx`, beside it, saying where
//! lines start, so that `read(after_seq)` seeks to the first line it returns, and
//! `last_of_type` and `run_start` go straight to the line they answer.
//!
//! In a JSONL journal the seq of an event is its line number, so an index of seq → byte offset
//! can always be rebuilt from the file by counting newlines, without parsing any JSON. The index
//! is never the truth: it is written after the batch it describes is durable, without `fsync`,
//! and everything it says is checked before use (see `seek.rs`):
//!
//! - the index names the file it describes (device and inode): a journal replaced under its
//!   name (a repair renames a new file over it) is indexed again;
//! - its `end` entry (the last line indexed: seq, offset, length of the complete lines) must
//!   still hold: the file is at least that long and the line at that offset carries that seq.
//!   Otherwise (a file shortened or rewritten, an index ahead of the file) it is rebuilt from the
//!   file; a file that grew past it (a writer that keeps no index, a crash between the journal's
//!   write and the index's) is read from there on, and only that part is scanned;
//! - every offset used is checked: the byte before it is a newline and the line there carries
//!   the expected seq (the `"seq":N}` that ends every line, else the line decoded); a line that
//!   does not is a stale index, rebuilt, and the operation is tried once more;
//! - a torn last line in the index (a crash while it was appended) is ignored, and an index that
//!   cannot be read (missing, garbled) is rebuilt.
//!
//! Only a rewrite of the journal in place that keeps its identity, the position and seq of its
//! last line and the position of every line the index names could go unnoticed (a marker
//! missing from the index): deleting the `.idx` file rebuilds it.
//!
//! Why a file per session rather than the tenant's run index (`.runs`): that index is read
//! whole and locked for the whole tenant at each lookup, while this one is read in proportion
//! to one session, and written under the session file's own lock (the append already holds it
//! exclusively, a reader shared: readers never write it while an append does).
//!
//! One entry per line, fields separated by one space (types and run ids hold none):
//!
//! ```text
//! loom-jsonl-index 1 <dev> <ino>           first line: the version and the journal file
//! at <seq> <offset>                        line <seq> starts at <offset> (every 64th line)
//! mark <type> <seq> <offset> <run_id>      line <seq>, at <offset>, is a <type> of <run_id>
//!                                          (run.started, session.snapshot, session.compacted)
//! end <seq> <offset> <len>                 every complete line before <len> is indexed; the
//!                                          last one is <seq>, at <offset>
//! ```
//!
//! Appends add their entries and a new `end`; the file is written again, compacted (one `end`),
//! when a batch crosses a multiple of [`COMPACT_EVERY`] lines, and whenever it is rebuilt.
//!
//! A store keeps the indexes it read or wrote last in memory ([`OffsetsCache`], a bounded
//! number of sessions), so the dozen reads of one run parse the `.idx` file once, not a dozen
//! times (in a 10,000-event session that parse was half the instructions of one more run). A kept
//! index is checked exactly like one read from the file.

use std::{
    collections::HashMap,
    fs::{self, File, OpenOptions},
    io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use crate::index::{FileId, envelope_hint};

/// The first word of an index file, and the format's version.
const HEADER: &str = "loom-jsonl-index 1";

/// One checkpoint every this many lines (lines 1, 65, 129, …).
pub(crate) const STRIDE: u64 = 64;

/// The length (bytes of complete lines) from which a journal's index is written to its `.idx`
/// file; a shorter journal's index lives only in the memory of the stores that read it. A
/// session of one devis run is 12 KB.
pub(crate) const INDEX_FROM: u64 = 16 * 1024;

/// The index is written again, compacted, when an append crosses a multiple of this many lines.
pub(crate) const COMPACT_EVERY: u64 = 512;

/// The types whose lines the index names: where a reader of the session starts (snapshots and
/// compactions) and where a run starts (a follower's first read).
pub(crate) const MARKED: [&str; 3] = ["run.started", "session.snapshot", "session.compacted"];

/// The entry of [`MARKED`] that `kind` is, if any.
fn marked(kind: &str) -> Option<&'static str> {
    MARKED.iter().copied().find(|marked| *marked == kind)
}

/// How many sessions' indexes a store keeps in memory ([`OffsetsCache`]).
const CACHED: usize = 64;

/// The offset indexes a JSONL store read or wrote last, by index path, so that the dozen reads
/// of one run do not parse the session's `.idx` file a dozen times. An entry is a copy of what
/// the file says and is checked like the file before use (the journal's identity, its `end`
/// line, every offset used): another process appending to the session is caught up from the
/// file, one rewriting it makes it stale and rebuilt. At most [`CACHED`] sessions are kept
/// (any one is dropped past that).
#[derive(Debug, Default)]
pub(crate) struct OffsetsCache {
    entries: Mutex<HashMap<PathBuf, Arc<Offsets>>>,
}

impl OffsetsCache {
    /// The index kept for `path`.
    pub(crate) fn get(&self, path: &Path) -> Option<Arc<Offsets>> {
        self.lock().get(path).cloned()
    }

    /// Keeps `offsets` as the index of `path`.
    pub(crate) fn put(&self, path: &Path, offsets: Arc<Offsets>) {
        let mut entries = self.lock();
        if entries.len() >= CACHED
            && !entries.contains_key(path)
            && let Some(evicted) = entries.keys().next().cloned()
        {
            entries.remove(&evicted);
        }
        entries.insert(path.to_path_buf(), offsets);
    }

    /// Adds the lines `added` indexed (an [`Offsets`] whose `end` follows them, built from
    /// `before`) to the index kept for `path`, when it ends at `before` in the same file:
    /// what an append that also appended them to the `.idx` file does, returning the index
    /// extended. Otherwise the entry is dropped (the next reader loads the file).
    pub(crate) fn extend(&self, path: &Path, before: End, added: &Offsets) -> Option<Arc<Offsets>> {
        let mut entries = self.lock();
        let kept = entries.get_mut(path)?;
        if kept.file != added.file || kept.end != before {
            entries.remove(path);
            return None;
        }
        let extended = Arc::make_mut(kept);
        extended.at.extend_from_slice(&added.at);
        extended.marks.extend(added.marks.iter().cloned());
        extended.end = added.end;
        Some(Arc::clone(kept))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<Offsets>>> {
        // A panic while holding it leaves a map of checked-before-use copies: still usable.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A line the index names by its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mark {
    /// The envelope's type (one of [`MARKED`]).
    pub(crate) kind: &'static str,
    /// The line's seq.
    pub(crate) seq: u64,
    /// Where it starts.
    pub(crate) offset: u64,
    /// The envelope's run.
    pub(crate) run: String,
}

/// The last line indexed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct End {
    /// Its seq (0: none).
    pub(crate) seq: u64,
    /// Where it starts.
    pub(crate) offset: u64,
    /// Where the complete lines end (just after its newline).
    pub(crate) len: u64,
}

/// The index of one journal file, as read from its `.idx` file or rebuilt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Offsets {
    /// The journal file it describes.
    pub(crate) file: FileId,
    /// Checkpoints `(seq, offset)`, ascending.
    pub(crate) at: Vec<(u64, u64)>,
    /// The marked lines, ascending.
    pub(crate) marks: Vec<Mark>,
    /// The last line indexed.
    pub(crate) end: End,
}

/// The index file of the journal at `journal`.
pub(crate) fn index_path(journal: &Path) -> PathBuf {
    let mut name = journal.as_os_str().to_owned();
    name.push(".idx");
    PathBuf::from(name)
}

/// The seq a journal line (without its newline) ends with: every line Loom and the reference
/// write ends with `"seq":N}`. `None` for a line written otherwise (it is then decoded).
pub(crate) fn seq_hint(line: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"seq\":";
    let body = line.strip_suffix(b"}")?;
    let start = body
        .len()
        .checked_sub(body.iter().rev().take_while(|b| b.is_ascii_digit()).count())?;
    let digits = &body[start..];
    if digits.is_empty() || !body[..start].ends_with(KEY) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

impl Offsets {
    /// An empty index of the file `file`.
    pub(crate) fn new(file: FileId) -> Offsets {
        Offsets {
            file,
            ..Offsets::default()
        }
    }

    /// Adds the line `seq` at `offset` (its bytes, with or without the newline, `len` bytes in
    /// the file with it) to the index, and its entries to `out` (the index file's text).
    pub(crate) fn push_line(
        &mut self,
        seq: u64,
        offset: u64,
        line: &[u8],
        len: u64,
        out: &mut String,
    ) {
        if (seq - 1).is_multiple_of(STRIDE) {
            self.at.push((seq, offset));
            out.push_str(&format!("at {seq} {offset}\n"));
        }
        if let Some((kind, run)) = envelope_hint(line)
            && let Some(kind) = marked(kind)
            && is_field(run)
        {
            out.push_str(&format!("mark {kind} {seq} {offset} {run}\n"));
            self.marks.push(Mark {
                kind,
                seq,
                offset,
                run: run.to_owned(),
            });
        }
        self.end = End {
            seq,
            offset,
            len: offset + len,
        };
    }

    /// The `end` entry.
    pub(crate) fn end_line(&self) -> String {
        format!(
            "end {} {} {}\n",
            self.end.seq, self.end.offset, self.end.len
        )
    }

    /// Indexes the complete lines of `file` from the end of the index to `limit` (a newline
    /// boundary), counting newlines: no line is parsed. Returns whether anything was added.
    pub(crate) fn scan(&mut self, file: &mut File, limit: u64) -> io::Result<bool> {
        let from = self.end.len;
        if limit <= from {
            return Ok(false);
        }
        file.seek(SeekFrom::Start(from))?;
        let mut reader = BufReader::with_capacity(64 * 1024, file.take(limit - from));
        let mut line = Vec::new();
        let mut offset = from;
        let mut seq = self.end.seq;
        let mut ignored = String::new();
        loop {
            line.clear();
            let read = reader.read_until(b'\n', &mut line)?;
            if read == 0 || line.last() != Some(&b'\n') {
                return Ok(offset > from);
            }
            seq += 1;
            self.push_line(seq, offset, &line, read as u64, &mut ignored);
            offset += read as u64;
        }
    }

    /// The known line start nearest before line `seq` (or at it): `(seq, offset)`; line 1 at 0
    /// when nothing nearer is known.
    pub(crate) fn before(&self, seq: u64) -> (u64, u64) {
        let mut best = (1, 0);
        let i = self.at.partition_point(|&(s, _)| s <= seq);
        if let Some(&found) = i.checked_sub(1).and_then(|i| self.at.get(i)) {
            best = found;
        }
        let mut consider = |s: u64, o: u64| {
            if s <= seq && s > best.0 {
                best = (s, o);
            }
        };
        consider(self.end.seq, self.end.offset);
        let m = self.marks.partition_point(|m| m.seq <= seq);
        if let Some(mark) = m.checked_sub(1).and_then(|m| self.marks.get(m)) {
            consider(mark.seq, mark.offset);
        }
        best
    }

    /// The text of the whole index, compacted (one `end`).
    fn text(&self) -> String {
        let mut out = format!("{HEADER} {} {}\n", self.file.0, self.file.1);
        let mut marks = self.marks.iter().peekable();
        for &(seq, offset) in &self.at {
            while let Some(mark) = marks.next_if(|m| m.seq < seq) {
                out.push_str(&mark_line(mark));
            }
            out.push_str(&format!("at {seq} {offset}\n"));
        }
        for mark in marks {
            out.push_str(&mark_line(mark));
        }
        out.push_str(&self.end_line());
        out
    }

    /// Writes the whole index to `path` (a temporary file renamed over it: a reader sees the
    /// old index or the new one, never half of one). Not synced: the index is a cache.
    pub(crate) fn save(&self, path: &Path) -> io::Result<()> {
        static TEMPORARY: AtomicU64 = AtomicU64::new(0);
        let mut name = path.as_os_str().to_owned();
        name.push(format!(
            ".tmp-{}-{}",
            std::process::id(),
            TEMPORARY.fetch_add(1, Ordering::Relaxed)
        ));
        let temporary = PathBuf::from(name);
        let written =
            fs::write(&temporary, self.text()).and_then(|()| fs::rename(&temporary, path));
        if written.is_err() {
            let _ = fs::remove_file(&temporary);
        }
        written
    }

    /// Reads the index at `path`: `Ok(None)` when there is none or it is not an index (a
    /// garbled line); a torn last line is ignored.
    pub(crate) fn load(path: &Path) -> io::Result<Option<Offsets>> {
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err),
        };
        Ok(parse(&bytes))
    }

    /// Appends `entries` to the index at `path` when it describes `file` up to exactly `end`
    /// (its last complete line is that `end` entry): what an append does after its batch, without
    /// reading the index. `Ok(false)` when it does not (the caller then rebuilds it).
    pub(crate) fn append_if_at(
        path: &Path,
        file: FileId,
        end: End,
        entries: &str,
    ) -> io::Result<bool> {
        let mut index = match OpenOptions::new().read(true).append(true).open(path) {
            Ok(index) => index,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(err) => return Err(err),
        };
        let len = index.metadata()?.len();
        let mut head = vec![0u8; usize::try_from(len.min(80)).map_err(io::Error::other)?];
        index.read_exact(&mut head)?;
        let header = format!("{HEADER} {} {}\n", file.0, file.1);
        if !head.starts_with(header.as_bytes()) {
            return Ok(false);
        }
        let expected = format!("end {} {} {}\n", end.seq, end.offset, end.len);
        let tail_len = (expected.len() as u64).min(len);
        let mut tail = vec![0u8; expected.len()];
        index.seek(SeekFrom::Start(len - tail_len))?;
        index.read_exact(&mut tail[..usize::try_from(tail_len).map_err(io::Error::other)?])?;
        // The entry must be a whole line of its own.
        let whole = len == tail_len || {
            let mut before = [0u8; 1];
            index.seek(SeekFrom::Start(len - tail_len - 1))?;
            index.read_exact(&mut before)?;
            before[0] == b'\n'
        };
        if !whole || tail != expected.as_bytes() {
            return Ok(false);
        }
        index.write_all(entries.as_bytes())?;
        Ok(true)
    }
}

/// The `mark` entry of `mark`.
fn mark_line(mark: &Mark) -> String {
    format!(
        "mark {} {} {} {}\n",
        mark.kind, mark.seq, mark.offset, mark.run
    )
}

/// Whether `text` can be a field of an entry (no separator, no newline, not empty).
fn is_field(text: &str) -> bool {
    !text.is_empty() && !text.bytes().any(|b| b.is_ascii_whitespace())
}

/// Parses an index file's bytes (`None` when a complete line is not an entry).
fn parse(bytes: &[u8]) -> Option<Offsets> {
    // A torn last line: the crash of an append to the index.
    let complete = bytes
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(&bytes[..0], |end| &bytes[..=end]);
    let text = std::str::from_utf8(complete).ok()?;
    let mut lines = text.lines();
    let header = lines.next()?;
    let file = header.strip_prefix(HEADER)?.trim_start();
    let (dev, ino) = file.split_once(' ')?;
    let mut offsets = Offsets::new((dev.parse().ok()?, ino.parse().ok()?));
    let number = |text: &str| text.parse::<u64>().ok();
    for line in lines {
        let mut fields = line.split(' ');
        let entry = fields.next()?;
        match entry {
            "at" => {
                let entry = (number(fields.next()?)?, number(fields.next()?)?);
                // Entries only grow; one that does not is from a file rewritten: keep order.
                if offsets.at.last().is_some_and(|last| last.0 >= entry.0) {
                    offsets.at.retain(|at| at.0 < entry.0);
                }
                offsets.at.push(entry);
            }
            "mark" => {
                let mark = Mark {
                    kind: marked(fields.next()?)?,
                    seq: number(fields.next()?)?,
                    offset: number(fields.next()?)?,
                    run: fields.next()?.to_owned(),
                };
                if offsets
                    .marks
                    .last()
                    .is_some_and(|last| last.seq >= mark.seq)
                {
                    offsets.marks.retain(|m| m.seq < mark.seq);
                }
                offsets.marks.push(mark);
            }
            "end" => {
                offsets.end = End {
                    seq: number(fields.next()?)?,
                    offset: number(fields.next()?)?,
                    len: number(fields.next()?)?,
                };
            }
            _ => return None,
        }
        if fields.next().is_some() {
            return None;
        }
    }
    Some(offsets)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_keeps_a_bounded_number_of_sessions_and_extends_only_what_it_follows() {
        let cache = OffsetsCache::default();
        for i in 0..CACHED + 10 {
            cache.put(
                Path::new(&format!("/j/{i}.jsonl.idx")),
                Arc::new(Offsets::new((1, 2))),
            );
        }
        assert_eq!(cache.lock().len(), CACHED);
        let last = PathBuf::from(format!("/j/{}.jsonl.idx", CACHED + 9));
        assert!(cache.get(&last).is_some());
        // Lines appended after the kept end extend it; after another end, the entry is dropped.
        let mut added = Offsets::new((1, 2));
        let mut text = String::new();
        added.push_line(
            1,
            0,
            br#"{"type":"run.started","run_id":"r1","seq":1}"#,
            50,
            &mut text,
        );
        cache.extend(&last, End::default(), &added);
        let kept = cache.get(&last).unwrap();
        assert_eq!((kept.end, kept.at.len()), (added.end, 1));
        cache.extend(&last, End::default(), &added);
        assert!(cache.get(&last).is_none());
    }

    #[test]
    fn the_seq_is_read_from_the_end_of_a_line() {
        assert_eq!(
            seq_hint(br#"{"a":1,"payload":{"seq":3},"seq":12}"#),
            Some(12)
        );
        assert_eq!(seq_hint(br#"{"seq":7}"#), Some(7));
        for other in [
            &br#"{"a":1,"seq":12"#[..],
            br#"{"a":1,"seq":}"#,
            br#"{"a":1,"seq":"12"}"#,
            br#"{"a":1,"xseq":12}"#,
            b"",
            b"}",
        ] {
            assert_eq!(seq_hint(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    fn line(kind: &str, run: &str) -> Vec<u8> {
        format!(r#"{{"run_id":"{run}","type":"{kind}","payload":{{}},"seq":0}}"#).into_bytes()
    }

    #[test]
    fn an_index_written_is_read_back_and_a_torn_or_garbled_one_is_not_believed() {
        let mut offsets = Offsets::new((3, 4));
        let mut out = String::new();
        let mut offset = 0;
        for seq in 1..=200u64 {
            let kind = match seq {
                1 | 90 => "run.started",
                70 => "session.snapshot",
                150 => "session.compacted",
                _ => "run.claimed",
            };
            let bytes = line(kind, &format!("r{seq}"));
            offsets.push_line(seq, offset, &bytes, bytes.len() as u64 + 1, &mut out);
            offset += bytes.len() as u64 + 1;
        }
        assert_eq!(offsets.at.len(), 4);
        assert_eq!(
            offsets.marks.iter().map(|m| m.seq).collect::<Vec<_>>(),
            [1, 70, 90, 150]
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl.idx");
        offsets.save(&path).unwrap();
        assert_eq!(Offsets::load(&path).unwrap().as_ref(), Some(&offsets));

        // The nearest start known before a line: a checkpoint, a mark or the end.
        assert_eq!(offsets.before(1), (1, 0));
        assert_eq!(offsets.before(64).0, 1);
        assert_eq!(offsets.before(66).0, 65);
        assert_eq!(offsets.before(75).0, 70);
        assert_eq!(offsets.before(200).0, 200);

        // An append finds its place only at the exact end; a torn entry is ignored.
        let end = offsets.end;
        assert!(!Offsets::append_if_at(&path, (3, 5), end, "").unwrap());
        let moved = End {
            len: end.len + 1,
            ..end
        };
        assert!(!Offsets::append_if_at(&path, (3, 4), moved, "").unwrap());
        assert!(Offsets::append_if_at(&path, (3, 4), end, "end 201 9").unwrap());
        assert_eq!(Offsets::load(&path).unwrap().unwrap().end, end);
        assert!(!Offsets::append_if_at(&path, (3, 4), end, "").unwrap());

        std::fs::write(&path, "loom-jsonl-index 1 3 4\nat x 0\n").unwrap();
        assert_eq!(Offsets::load(&path).unwrap(), None);
        std::fs::write(&path, "something else\n").unwrap();
        assert_eq!(Offsets::load(&path).unwrap(), None);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(Offsets::load(&path).unwrap(), None);
    }
}
