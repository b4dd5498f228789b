//! The run index of the JSONL store: which session file holds the `run.started` of which run,
//! one index per tenant at `<root>/<tenant>/.runs`, so that finding a run (or learning that it
//! does not exist) does not read every session of the tenant.
//!
//! The index is never the truth. It is a cache of what the journal files say, written without
//! `fsync`, and everything it says is checked:
//!
//! - an entry is used only once the line it points to is checked to be that run's `run.started`
//!   (a deleted, rewritten or replaced file fails the check);
//! - for each session file it records how far it was read (`scanned`: the file's identity, its
//!   modification time and length, and a fingerprint of its first bytes and of the bytes before
//!   that point), so a lookup that finds nothing first reads what was written since in every
//!   session file — by any writer, one that does not keep the index included — and indexes it.
//!   A file whose identity, time and length are unchanged is not opened; one that only grew
//!   (same identity, same fingerprint) is read from where the index stopped; any other (new,
//!   shorter, replaced, rewritten) is read again from its start. Only a rewrite in place that
//!   keeps the file's identity, length and modification time (within the file system's time
//!   granularity) goes unnoticed: deleting the index rebuilds it;
//! - a missing or unreadable index is rebuilt from the files.
//!
//! The store adds the runs of each batch it appends at once (after the batch is durable), so a
//! run is usually found without reading anything but its line.
//!
//! One entry per line, fields separated by one space (ids are safe ids, which hold none):
//!
//! ```text
//! run <run_id> <session_id> <offset>    the run.started of <run_id> is the line at <offset>
//! scanned <session_id> <dev> <ino> <mtime> <file len> <end> <print>
//!                                       every complete line before byte <end> is indexed
//! forget <session_id>                   the file was deleted or rewritten: read it again
//! ```
//!
//! Every access holds an exclusive lock on the index file; a lookup reads session files without
//! their lock (it reads complete lines only), so it never waits for an appender, which may wait
//! for it.

use std::{
    collections::HashMap,
    fs::{self, File, OpenOptions},
    io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
};

use loom_core::ids::is_safe_id;

/// The index file's name in a tenant directory (a leading dot: no session id can take it).
pub(crate) const INDEX_FILE: &str = ".runs";

/// The longest line a lookup reads to check an entry: a `run.started` envelope names its run
/// in its first few hundred bytes.
const CHECK_BYTES: u64 = 4096;

/// An index of one tenant, as read from its file.
#[derive(Debug, Default)]
struct Index {
    /// Run id → `(session, offset)` of each `run.started` line seen, oldest first.
    runs: HashMap<String, Vec<(String, u64)>>,
    /// Session → what was read of its file.
    scanned: HashMap<String, Seen>,
    /// Lines in the file (to decide when to compact it).
    lines: usize,
}

/// What the index read of a session file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    /// The file's identity.
    id: FileId,
    /// Its modification time (nanoseconds since the epoch) and length when it was read.
    mtime: u128,
    len: u64,
    /// Every complete line before this offset is indexed.
    end: u64,
    /// [`fingerprint`] of the file at `end`.
    print: u64,
}

/// What identifies a file beyond its name (device and inode on Unix), so that a file replaced
/// under the same name is noticed.
pub(crate) type FileId = (u64, u64);

/// The identity of the file `meta` describes.
pub(crate) fn file_id(meta: &fs::Metadata) -> FileId {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        (meta.dev(), meta.ino())
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        (0, 0)
    }
}

/// The type and run id an event line's envelope names, found without parsing the line (so
/// also for a line that does not read back): the first `"type":"…"` and `"run_id":"…"`, which
/// the envelope writes before its payload. A hint, checked by whoever uses it.
pub(crate) fn envelope_hint(line: &[u8]) -> Option<(&str, &str)> {
    let value = |key: &[u8]| -> Option<&str> {
        let start = find(line, key)? + key.len();
        let len = line[start..].iter().position(|&b| b == b'"')?;
        std::str::from_utf8(&line[start..start + len]).ok()
    };
    Some((value(b"\"type\":\"")?, value(b"\"run_id\":\"")?))
}

/// Whether the line names `run_id`'s `run.started`.
fn starts_run(line: &[u8], run_id: &str) -> bool {
    envelope_hint(line).is_some_and(|(kind, run)| kind == "run.started" && run == run_id)
}

/// A file's modification time, in nanoseconds since the epoch (0 when unknown).
pub(crate) fn mtime(meta: &fs::Metadata) -> u128 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

/// How many bytes of each end of the indexed part [`fingerprint`] hashes.
const PRINT_BYTES: u64 = 256;

/// A fingerprint of the first `end` bytes of `file`: a hash of their first and last
/// [`PRINT_BYTES`] bytes. A file that only grew keeps it; a file replaced or rewritten almost
/// never does.
pub(crate) fn fingerprint(file: &mut File, end: u64) -> io::Result<u64> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    let head = PRINT_BYTES.min(end);
    let mut bytes = vec![0u8; usize::try_from(head).map_err(io::Error::other)?];
    file.seek(SeekFrom::Start(0))?;
    file.read_exact(&mut bytes)?;
    hasher.update(&bytes);
    file.seek(SeekFrom::Start(end - head))?;
    file.read_exact(&mut bytes)?;
    hasher.update(&bytes);
    hasher.update(end.to_le_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    Ok(u64::from_le_bytes(first))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The index of a tenant directory.
#[derive(Debug)]
pub(crate) struct RunIndex {
    dir: PathBuf,
}

impl RunIndex {
    /// The index of the tenant directory `dir`.
    pub(crate) fn new(dir: PathBuf) -> RunIndex {
        RunIndex { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.join(INDEX_FILE)
    }

    fn journal(&self, session: &str) -> PathBuf {
        self.dir.join(format!("{session}.jsonl"))
    }

    /// Opens the index file under its exclusive lock (`None` when the tenant directory does not
    /// exist: there is nothing to index).
    fn open(&self) -> io::Result<Option<File>> {
        let file = match OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(self.path())
        {
            Ok(file) => file,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err),
        };
        file.lock()?;
        Ok(Some(file))
    }

    /// Records runs just appended to `session`: `(run id, offset of its line)`. Best effort: the
    /// index is only a cache, and a lookup indexes what it lacks.
    pub(crate) fn add(&self, session: &str, runs: &[(String, u64)]) -> io::Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        let Some(mut file) = self.open()? else {
            return Ok(());
        };
        let mut text = String::new();
        for (run, offset) in runs {
            text.push_str(&format!("run {run} {session} {offset}\n"));
        }
        file.write_all(text.as_bytes())
    }

    /// Forgets how far `session`'s file was read (it was deleted or rewritten): the next lookup
    /// reads it again from its start.
    pub(crate) fn forget(&self, session: &str) -> io::Result<()> {
        let Some(mut file) = self.open()? else {
            return Ok(());
        };
        file.write_all(format!("forget {session}\n").as_bytes())
    }

    /// The session whose file holds the `run.started` line of `run_id`, if any (see the module
    /// documentation).
    pub(crate) fn find(&self, run_id: &str) -> io::Result<Option<String>> {
        let Some(mut file) = self.open()? else {
            return Ok(None);
        };
        let mut index = match read(&mut file)? {
            Some(index) => index,
            None => {
                tracing::warn!(
                    path = %self.path().display(),
                    "the run index is unreadable: rebuilding it from the journal files"
                );
                file.set_len(0)?;
                Index::default()
            }
        };
        if let Some(found) = self.checked(&index, run_id)? {
            return Ok(Some(found));
        }
        let mut added = String::new();
        self.catch_up(&mut index, &mut added)?;
        if index.lines > 1024 && index.lines > 4 * (index.runs.len() + index.scanned.len()) {
            compact(&mut file, &index, &self.dir)?;
        } else {
            file.write_all(added.as_bytes())?;
        }
        self.checked(&index, run_id)
    }

    /// The most recent entry of `run_id` whose line checks out.
    fn checked(&self, index: &Index, run_id: &str) -> io::Result<Option<String>> {
        let Some(entries) = index.runs.get(run_id) else {
            return Ok(None);
        };
        for (session, offset) in entries.iter().rev() {
            if self.line_starts_run(session, *offset, run_id)? {
                return Ok(Some(session.clone()));
            }
        }
        Ok(None)
    }

    /// Whether the line at `offset` of `session`'s file is `run_id`'s `run.started`.
    fn line_starts_run(&self, session: &str, offset: u64, run_id: &str) -> io::Result<bool> {
        let mut file = match File::open(self.journal(session)) {
            Ok(file) => file,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(err) => return Err(err),
        };
        let len = file.metadata()?.len();
        if offset >= len {
            return Ok(false);
        }
        // The entry must point at the start of a line.
        if offset > 0 {
            let mut before = [0u8; 1];
            file.seek(SeekFrom::Start(offset - 1))?;
            file.read_exact(&mut before)?;
            if before[0] != b'\n' {
                return Ok(false);
            }
        }
        file.seek(SeekFrom::Start(offset))?;
        let mut head = Vec::new();
        file.take(CHECK_BYTES).read_to_end(&mut head)?;
        Ok(starts_run(&head, run_id))
    }

    /// Reads what was written to each session file since the index last read it, adding the
    /// runs found to `index` and their lines to `added`.
    fn catch_up(&self, index: &mut Index, added: &mut String) -> io::Result<()> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(err) => return Err(err),
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let Some(session) = name
                .to_str()
                .and_then(|name| name.strip_suffix(".jsonl"))
                .filter(|session| is_safe_id(session))
            else {
                continue;
            };
            let meta = match fs::metadata(entry.path()) {
                Ok(meta) => meta,
                // Deleted meanwhile.
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            };
            let seen = index.scanned.get(session).copied();
            let unchanged = |meta: &fs::Metadata, seen: Seen| {
                seen.id == file_id(meta) && seen.mtime == mtime(meta) && seen.len == meta.len()
            };
            if seen.is_some_and(|seen| unchanged(&meta, seen)) {
                continue;
            }
            let mut file = match File::open(entry.path()) {
                Ok(file) => file,
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            };
            // The file may have been replaced between the two looks: read the one opened.
            let meta = file.metadata()?;
            let len = meta.len();
            let from = match seen {
                Some(seen)
                    if seen.id == file_id(&meta)
                        && seen.end <= len
                        && fingerprint(&mut file, seen.end)? == seen.print =>
                {
                    seen.end
                }
                _ => 0,
            };
            let (runs, end) = scan(&mut file, from, len)?;
            for (run, offset) in runs {
                let known = index.runs.entry(run.clone()).or_default();
                let entry = (session.to_owned(), offset);
                if !known.contains(&entry) {
                    added.push_str(&format!("run {run} {session} {offset}\n"));
                    index.lines += 1;
                    known.push(entry);
                }
            }
            let seen = Seen {
                id: file_id(&meta),
                mtime: mtime(&meta),
                len,
                end,
                print: fingerprint(&mut file, end)?,
            };
            added.push_str(&scanned_line(session, &seen));
            index.lines += 1;
            index.scanned.insert(session.to_owned(), seen);
        }
        Ok(())
    }
}

/// The runs started in the complete lines of `file` between `from` (the start of a line) and
/// `len`, with their offsets, and where the last complete line ends.
fn scan(file: &mut File, from: u64, len: u64) -> io::Result<(Vec<(String, u64)>, u64)> {
    file.seek(SeekFrom::Start(from))?;
    let mut reader = BufReader::with_capacity(64 * 1024, file.take(len - from));
    let mut runs = Vec::new();
    let mut offset = from;
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line)?;
        if read == 0 || line.last() != Some(&b'\n') {
            // The end, or a torn line: indexed once it is complete.
            return Ok((runs, offset));
        }
        if let Some(("run.started", run)) = envelope_hint(&line)
            && is_safe_id(run)
        {
            runs.push((run.to_owned(), offset));
        }
        offset += read as u64;
    }
}

/// Parses the index file (`None` when a line is not an entry: the file is then rebuilt).
fn read(file: &mut File) -> io::Result<Option<Index>> {
    file.seek(SeekFrom::Start(0))?;
    let mut text = String::new();
    if file.read_to_string(&mut text).is_err() {
        return Ok(None);
    }
    let mut index = Index::default();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let number = |text: &str| text.parse::<u64>().ok();
        match fields.as_slice() {
            ["run", run, session, offset] if is_safe_id(session) => {
                let Some(offset) = number(offset) else {
                    return Ok(None);
                };
                index
                    .runs
                    .entry((*run).to_owned())
                    .or_default()
                    .push(((*session).to_owned(), offset));
            }
            ["scanned", session, dev, ino, mtime, len, end, print] => {
                let (Some(dev), Some(ino), Ok(mtime), Some(len), Some(end), Some(print)) = (
                    number(dev),
                    number(ino),
                    mtime.parse::<u128>(),
                    number(len),
                    number(end),
                    number(print),
                ) else {
                    return Ok(None);
                };
                let seen = Seen {
                    id: (dev, ino),
                    mtime,
                    len,
                    end,
                    print,
                };
                index.scanned.insert((*session).to_owned(), seen);
            }
            ["forget", session] => {
                index.scanned.remove(*session);
            }
            _ => return Ok(None),
        }
        index.lines += 1;
    }
    Ok(Some(index))
}

/// The `scanned` line of `session`.
fn scanned_line(session: &str, seen: &Seen) -> String {
    format!(
        "scanned {session} {} {} {} {} {} {}\n",
        seen.id.0, seen.id.1, seen.mtime, seen.len, seen.end, seen.print
    )
}

/// Rewrites the index file with one line per live entry (runs of session files that no longer
/// exist are dropped).
fn compact(file: &mut File, index: &Index, dir: &Path) -> io::Result<()> {
    let mut text = String::new();
    for (run, entries) in &index.runs {
        for (session, offset) in entries {
            if index.scanned.contains_key(session) || dir.join(format!("{session}.jsonl")).exists()
            {
                text.push_str(&format!("run {run} {session} {offset}\n"));
            }
        }
    }
    for (session, seen) in &index.scanned {
        text.push_str(&scanned_line(session, seen));
    }
    file.set_len(0)?;
    file.write_all(text.as_bytes())
}

/// Where the index of `tenant` under `root` lives.
pub(crate) fn tenant_index(root: &Path, tenant: &str) -> RunIndex {
    RunIndex::new(root.join(tenant))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_is_made_out_without_parsing() {
        let line = br#"{"event_id":"e","ts":"t","schema_version":1,"tenant_id":"t","session_id":"s","run_id":"r1","root_run_id":"r1","span_id":"x","parent_span_id":null,"type":"run.started","category":"run","payload":{"type":"run.started","context":{"metadata":{"run_id":"evil","a":[[[["#;
        assert_eq!(envelope_hint(line), Some(("run.started", "r1")));
        assert!(starts_run(line, "r1"));
        assert!(!starts_run(line, "evil"));
        assert_eq!(envelope_hint(b"garbage"), None);
    }

    #[test]
    fn a_file_that_is_not_an_index_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(INDEX_FILE), "run r1 s1 notanumber\n").unwrap();
        let mut file = File::open(dir.path().join(INDEX_FILE)).unwrap();
        assert!(read(&mut file).unwrap().is_none());
    }
}
