//! The search index of the JSONL store: the envelope of every event of a tenant, by type, at
//! `<root>/<tenant>/.search/`, so that an event search reads the index entries of the types it
//! asks for (no JSON) and decodes only the events it returns, instead of every session.
//!
//! Like the other indexes beside the journal files, it is never the truth: a cache of what the
//! files say, written without `fsync`, brought up to date at each search, and checked:
//!
//! - `scanned` records, for each session file, how far it was indexed (its identity,
//!   modification time and length, and a fingerprint of the bytes before that point, as the run
//!   index does) under a generation number. A search first reads what was written since in
//!   every session file (by any writer: appends do not write this index) and indexes it; a file
//!   that only grew is read from where the index stopped, any other (new, replaced, rewritten,
//!   shorter) from its start under a new generation, which retires every entry of the old one;
//! - entries of a session whose file is gone, or of another generation, are dead: skipped, and
//!   a type file is written again without them when they outnumber the live ones;
//! - every event returned is decoded from its journal line and must be the line the entry
//!   names (seq and id) and pass the filter; when one does not (a file rewritten in a way the
//!   checks above missed), the store declines the search and the caller scans, as it does when
//!   a session holds a line that does not read back (the scan names it);
//! - a torn last line (a crash while the index was written) is ignored; an index file that
//!   cannot be read is rebuilt from the journal files (deleting `.search` does the same).
//!
//! Order: the store's write order is each session's journal order, sessions interleaved by
//! time: events are sorted by the largest `ts` seen so far in their session (so a session's
//! order is kept even when a retried batch carries an earlier time), then session id, then
//! seq. That order does not depend on which types are read, so pages of a search (`after`)
//! never skip or repeat an event.
//!
//! Files (fields separated by one space; free text percent-encoded):
//!
//! ```text
//! scanned   "scanned <session> <gen> <dev> <ino> <mtime> <len> <end> <print> <order> <broken>"
//!           (the last line of a session wins; <order>: the largest ts indexed, in µs;
//!           <broken>: 1 when a line of the file does not read back)
//! t.<type>  "<session> <gen> <seq> <offset> <order> <ts> <event_id> <run> <category>
//!            <status> <agent> <role> <facets>" (`-` for none; facets `name=value,…`, the
//!           string-valued ones)
//! lock      held exclusively by whoever reads or writes the index
//! ```

use std::{
    collections::{HashMap, HashSet},
    fs::{self, File, OpenOptions},
    io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
};

use loom_core::{
    event::Event,
    ids::is_safe_id,
    search::{EventFilter, Searched},
};
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

use crate::index::{FileId, file_id, fingerprint, mtime};

/// The index directory's name in a tenant directory (a leading dot: no session id can take it).
pub(crate) const SEARCH_DIR: &str = ".search";

/// What free text must escape to stay one field.
const FIELD: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b',').add(b'=');

/// The type file of entries whose type cannot name a file.
const OTHER_TYPES: &str = "t._";

/// What the index read of a session file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    generation: u64,
    id: FileId,
    mtime: u128,
    len: u64,
    /// Every complete line before this offset is indexed.
    end: u64,
    print: u64,
    /// The largest `ts` indexed (µs since the epoch).
    order: i64,
    /// A line of the file does not read back.
    broken: bool,
}

/// One indexed event.
#[derive(Debug, Clone)]
struct Entry {
    session: String,
    generation: u64,
    seq: u64,
    offset: u64,
    order: i64,
    ts: i64,
    event_id: String,
    run: String,
    category: String,
    status: String,
    agent: Option<String>,
    role: Option<String>,
    facets: Vec<(String, String)>,
}

impl Entry {
    fn key(&self) -> (i64, &str, u64) {
        (self.order, &self.session, self.seq)
    }

    /// Whether the entry passes the filter's envelope rules (all but `after` and `limit`).
    fn passes(&self, filter: &EventFilter, wanted: &Wanted) -> bool {
        filter
            .session_id
            .as_ref()
            .is_none_or(|s| self.session == *s)
            && filter.run_id.as_ref().is_none_or(|r| self.run == *r)
            && (wanted.categories.is_empty() || wanted.categories.contains(&self.category))
            && (wanted.statuses.is_empty() || wanted.statuses.contains(&self.status))
            && filter
                .agent
                .as_ref()
                .is_none_or(|a| self.agent.as_ref() == Some(a))
            && filter.agents.as_ref().is_none_or(|allowed| {
                self.agent
                    .as_ref()
                    .is_some_and(|agent| allowed.contains(agent))
            })
            && filter
                .role
                .as_ref()
                .is_none_or(|r| self.role.as_ref() == Some(r))
            && filter
                .facets
                .iter()
                .all(|(name, value)| self.facets.iter().any(|(n, v)| n == name && v == value))
            && filter.since.is_none_or(|since| self.ts >= micros_up(since))
            && filter.until.is_none_or(|until| self.ts < micros_up(until))
    }

    fn line(&self) -> String {
        let opt = |value: &Option<String>| value.as_deref().map_or("-".to_owned(), encode);
        let facets = if self.facets.is_empty() {
            "-".to_owned()
        } else {
            self.facets
                .iter()
                .map(|(name, value)| format!("{}={}", encode(name), encode(value)))
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "{} {} {} {} {} {} {} {} {} {} {} {} {}\n",
            self.session,
            self.generation,
            self.seq,
            self.offset,
            self.order,
            self.ts,
            encode(&self.event_id),
            encode(&self.run),
            encode(&self.category),
            encode(&self.status),
            opt(&self.agent),
            opt(&self.role),
            facets
        )
    }

    fn parse(line: &str) -> Option<Entry> {
        let fields: Vec<&str> = line.split(' ').collect();
        let [
            session,
            generation,
            seq,
            offset,
            order,
            ts,
            event_id,
            run,
            category,
            status,
            agent,
            role,
            facets,
        ] = fields.as_slice()
        else {
            return None;
        };
        let opt = |field: &str| match field {
            "-" => Some(None),
            text => decode(text).map(Some),
        };
        let facets = match *facets {
            "-" => Vec::new(),
            text => text
                .split(',')
                .map(|pair| {
                    let (name, value) = pair.split_once('=')?;
                    Some((decode(name)?, decode(value)?))
                })
                .collect::<Option<Vec<_>>>()?,
        };
        Some(Entry {
            session: (*session).to_owned(),
            generation: generation.parse().ok()?,
            seq: seq.parse().ok()?,
            offset: offset.parse().ok()?,
            order: order.parse().ok()?,
            ts: ts.parse().ok()?,
            event_id: decode(event_id)?,
            run: decode(run)?,
            category: decode(category)?,
            status: decode(status)?,
            agent: opt(agent)?,
            role: opt(role)?,
            facets,
        })
    }
}

/// An instant in whole microseconds, rounded up: a journal `ts` (whole microseconds) is at or
/// after `at` exactly when it is at or after this.
fn micros_up(at: chrono::DateTime<chrono::Utc>) -> i64 {
    at.timestamp_micros() + i64::from(!at.timestamp_subsec_nanos().is_multiple_of(1000))
}

/// The filter's enumerations as the index writes them.
struct Wanted {
    categories: Vec<String>,
    statuses: Vec<String>,
}

fn encode(text: &str) -> String {
    utf8_percent_encode(text, FIELD).to_string()
}

fn decode(text: &str) -> Option<String> {
    percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

/// The name an enumeration is written under in the journal (`"run"`, `"ok"`).
fn enum_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// The file of `event_type`'s entries.
fn type_file(event_type: &str) -> String {
    let plain = !event_type.is_empty()
        && event_type
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !event_type.starts_with('.');
    if plain {
        format!("t.{event_type}")
    } else {
        OTHER_TYPES.to_owned()
    }
}

/// The search index of one tenant directory.
#[derive(Debug)]
pub(crate) struct SearchIndex {
    tenant: String,
    dir: PathBuf,
}

/// The live state of the index once brought up to date: each session file's record.
#[derive(Debug, Default)]
struct Scanned {
    sessions: HashMap<String, Seen>,
    next_generation: u64,
    lines: usize,
}

impl SearchIndex {
    /// The index of `tenant`'s directory `dir`.
    pub(crate) fn new(tenant: &str, dir: PathBuf) -> SearchIndex {
        SearchIndex {
            tenant: tenant.to_owned(),
            dir,
        }
    }

    fn index_dir(&self) -> PathBuf {
        self.dir.join(SEARCH_DIR)
    }

    /// Answers `filter` from the index (see the module documentation): `None` when the index
    /// cannot answer for sure, and the caller scans.
    pub(crate) fn search(&self, filter: &EventFilter) -> io::Result<Option<Searched>> {
        if !self.dir.is_dir() {
            return Ok(Some(if filter.after.is_some() {
                Searched::UnknownAfter
            } else {
                Searched::Found(Vec::new())
            }));
        }
        let index_dir = self.index_dir();
        fs::create_dir_all(&index_dir)?;
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(index_dir.join("lock"))?;
        lock.lock()?;
        let scanned = match self.catch_up() {
            Ok(scanned) => scanned,
            Err(Stale) => {
                tracing::warn!(
                    path = %index_dir.display(),
                    "the search index is unreadable: rebuilding it from the journal files"
                );
                self.clear()?;
                self.catch_up()
                    .map_err(|Stale| io::Error::other("the search index could not be rebuilt"))?
            }
        };
        if scanned.sessions.values().any(|seen| seen.broken) {
            // A session holds a line that does not read back: the scan leaves it out, naming it.
            return Ok(None);
        }
        self.answer(filter, &scanned)
    }

    /// Removes every index file (the index is rebuilt from the journals).
    fn clear(&self) -> io::Result<()> {
        for entry in fs::read_dir(self.index_dir())? {
            let entry = entry?;
            if entry.file_name() != "lock" {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(())
    }

    /// Indexes what was written to every session file since the index last read it.
    fn catch_up(&self) -> Result<Scanned, Stale> {
        let mut scanned = self.read_scanned()?;
        let mut live = HashMap::new();
        let mut added: HashMap<String, String> = HashMap::new();
        let mut records = String::new();
        let entries = fs::read_dir(&self.dir).map_err(|_| Stale)?;
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let name = entry.file_name();
            let Some(session) = name
                .to_str()
                .and_then(|name| name.strip_suffix(".jsonl"))
                .filter(|session| is_safe_id(session))
            else {
                continue;
            };
            let Ok(meta) = fs::metadata(entry.path()) else {
                continue;
            };
            let seen = scanned.sessions.get(session).copied();
            if let Some(seen) = seen
                && seen.id == file_id(&meta)
                && seen.mtime == mtime(&meta)
                && seen.len == meta.len()
            {
                live.insert(session.to_owned(), seen);
                continue;
            }
            let Ok(mut file) = File::open(entry.path()) else {
                continue;
            };
            let meta = file.metadata().map_err(|_| Stale)?;
            let len = meta.len();
            let grown = match seen {
                Some(seen)
                    if seen.id == file_id(&meta)
                        && seen.end <= len
                        && fingerprint(&mut file, seen.end).ok() == Some(seen.print) =>
                {
                    Some(seen)
                }
                _ => None,
            };
            let mut seen = grown.unwrap_or_else(|| {
                scanned.next_generation += 1;
                Seen {
                    generation: scanned.next_generation,
                    id: file_id(&meta),
                    mtime: 0,
                    len: 0,
                    end: 0,
                    print: 0,
                    order: i64::MIN,
                    broken: false,
                }
            });
            self.scan(session, &mut file, len, &mut seen, &mut added)
                .map_err(|_| Stale)?;
            seen.id = file_id(&meta);
            seen.mtime = mtime(&meta);
            seen.len = len;
            seen.print = fingerprint(&mut file, seen.end).map_err(|_| Stale)?;
            records.push_str(&scanned_line(session, &seen));
            scanned.lines += 1;
            live.insert(session.to_owned(), seen);
        }
        // Entries first, then the records that say they are there: a crash in between leaves
        // entries that the next catch-up writes again (duplicates are skipped when read).
        for (file, text) in &added {
            append(&self.index_dir().join(file), text).map_err(|_| Stale)?;
        }
        if scanned.lines > 1024 && scanned.lines > 4 * live.len() {
            let text: String = live
                .iter()
                .map(|(session, seen)| scanned_line(session, seen))
                .collect();
            scanned.lines = live.len();
            replace(&self.index_dir().join("scanned"), &text).map_err(|_| Stale)?;
        } else if !records.is_empty() {
            append(&self.index_dir().join("scanned"), &records).map_err(|_| Stale)?;
        }
        scanned.sessions = live;
        Ok(scanned)
    }

    /// Indexes the complete lines of `file` from `seen.end` to `len`.
    fn scan(
        &self,
        session: &str,
        file: &mut File,
        len: u64,
        seen: &mut Seen,
        added: &mut HashMap<String, String>,
    ) -> io::Result<()> {
        let from = seen.end;
        file.seek(SeekFrom::Start(from))?;
        let mut reader = BufReader::with_capacity(64 * 1024, file.take(len - from));
        let mut offset = from;
        let mut line = Vec::new();
        loop {
            line.clear();
            let read = reader.read_until(b'\n', &mut line)?;
            if read == 0 || line.last() != Some(&b'\n') {
                // The end, or a torn line: indexed once it is complete.
                seen.end = offset;
                return Ok(());
            }
            line.pop();
            match self.decode(session, &line) {
                Some(event) => {
                    let ts = event.ts.timestamp_micros();
                    seen.order = seen.order.max(ts);
                    let entry = Entry {
                        session: session.to_owned(),
                        generation: seen.generation,
                        seq: event.seq,
                        offset,
                        order: seen.order,
                        ts,
                        event_id: event.event_id.clone(),
                        run: event.run_id.clone(),
                        category: enum_name(&event.category),
                        status: enum_name(&event.status),
                        agent: event.agent.clone(),
                        role: event.role.clone(),
                        facets: event
                            .facets
                            .iter()
                            .filter_map(|(name, value)| {
                                value.as_str().map(|v| (name.clone(), v.to_owned()))
                            })
                            .collect(),
                    };
                    added
                        .entry(type_file(&event.event_type))
                        .or_default()
                        .push_str(&entry.line());
                }
                None if !line.iter().all(u8::is_ascii_whitespace) => seen.broken = true,
                None => {}
            }
            offset += read as u64;
        }
    }

    /// The event of a journal line, when it reads back and belongs to the session.
    fn decode(&self, session: &str, line: &[u8]) -> Option<Event> {
        let text = std::str::from_utf8(line).ok()?;
        let event = Event::from_json(text).ok()?;
        (event.tenant_id == self.tenant && event.session_id == session && event.seq > 0)
            .then_some(event)
    }

    /// Reads the `scanned` records (a torn last line ignored); [`Stale`] when another line is
    /// not a record.
    fn read_scanned(&self) -> Result<Scanned, Stale> {
        let mut scanned = Scanned::default();
        let text = match fs::read(self.index_dir().join("scanned")) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(scanned),
            Err(_) => return Err(Stale),
        };
        let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let text = std::str::from_utf8(&text[..complete]).map_err(|_| Stale)?;
        for line in text.lines() {
            let (session, seen) = parse_scanned(line).ok_or(Stale)?;
            scanned.next_generation = scanned.next_generation.max(seen.generation);
            scanned.sessions.insert(session, seen);
            scanned.lines += 1;
        }
        Ok(scanned)
    }

    /// The events that pass `filter`, from the entries of the live sessions.
    fn answer(&self, filter: &EventFilter, scanned: &Scanned) -> io::Result<Option<Searched>> {
        let wanted = Wanted {
            categories: filter.categories.iter().map(enum_name).collect(),
            statuses: filter.statuses.iter().map(enum_name).collect(),
        };
        let files: Vec<String> = if filter.types.is_empty() {
            self.type_files()?
        } else {
            let mut files: Vec<String> = filter.types.iter().map(|t| type_file(t)).collect();
            files.sort();
            files.dedup();
            files
        };
        let mut entries = Vec::new();
        for file in &files {
            entries.extend(self.live_entries(file, scanned)?);
        }
        entries.sort_by(|a, b| a.key().cmp(&b.key()));
        let start = match &filter.after {
            None => 0,
            Some(after) => {
                // The first event of that id in the order: among the entries read, and, when
                // the search reads only some types, among the others (`after` may be an event
                // of a type it does not ask for), whose lines are parsed only when they name it.
                let mut cursor = cursor(&entries, after, filter);
                if !filter.types.is_empty() {
                    for file in self.type_files()? {
                        if !files.contains(&file) {
                            let found = self.find_cursor(&file, after, filter, scanned)?;
                            cursor = match (cursor, found) {
                                (Some(a), Some(b)) => Some(a.min(b)),
                                (a, b) => a.or(b),
                            };
                        }
                    }
                }
                let Some((order, session, seq)) = cursor else {
                    return Ok(Some(Searched::UnknownAfter));
                };
                entries.partition_point(|e| e.key() <= (order, session.as_str(), seq))
            }
        };
        let types: HashSet<&str> = filter.types.iter().map(String::as_str).collect();
        let mut found = Vec::new();
        let mut journals: HashMap<String, File> = HashMap::new();
        for entry in entries[start..]
            .iter()
            .filter(|e| e.passes(filter, &wanted))
        {
            if found.len() == filter.limit {
                break;
            }
            let Some(event) = self.event_at(&mut journals, entry)? else {
                return Ok(None);
            };
            if !(types.is_empty() || types.contains(event.event_type.as_str()))
                && type_file(&event.event_type) == OTHER_TYPES
            {
                // Another of the odd types that share one file.
                continue;
            }
            if !(types.is_empty() || types.contains(event.event_type.as_str()))
                || !filter.matches(&event)
            {
                tracing::debug!(
                    session = %entry.session,
                    seq = entry.seq,
                    "search index entry does not match its line: the store scans instead"
                );
                return Ok(None);
            }
            found.push(event);
        }
        Ok(Some(Searched::Found(found)))
    }

    /// The key of the first live entry of `file` whose event id is `after` (of the session
    /// searched, when one is given).
    fn find_cursor(
        &self,
        file: &str,
        after: &str,
        filter: &EventFilter,
        scanned: &Scanned,
    ) -> io::Result<Option<(i64, String, u64)>> {
        let bytes = match fs::read(self.index_dir().join(file)) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err),
        };
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let text = String::from_utf8_lossy(&bytes[..complete]);
        let needle = format!(" {} ", encode(after));
        Ok(text
            .lines()
            .filter(|line| line.contains(&needle))
            .filter_map(Entry::parse)
            .filter(|e| {
                is_live(e, scanned)
                    && e.event_id == after
                    && filter.session_id.as_ref().is_none_or(|s| e.session == *s)
            })
            .map(|e| (e.order, e.session, e.seq))
            .min())
    }

    /// The names of the type files that exist.
    fn type_files(&self) -> io::Result<Vec<String>> {
        let mut files = Vec::new();
        for entry in fs::read_dir(self.index_dir())? {
            let entry = entry?;
            if let Some(name) = entry.file_name().to_str()
                && name.starts_with("t.")
            {
                files.push(name.to_owned());
            }
        }
        files.sort();
        Ok(files)
    }

    /// The live entries of one type file (see the module documentation), the file written
    /// again without its dead ones when they outnumber the live.
    fn live_entries(&self, file: &str, scanned: &Scanned) -> io::Result<Vec<Entry>> {
        let path = self.index_dir().join(file);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(err),
        };
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let text = String::from_utf8_lossy(&bytes[..complete]);
        let mut live = Vec::new();
        let mut seen = HashSet::new();
        let mut dead = 0usize;
        for line in text.lines() {
            let Some(entry) = Entry::parse(line) else {
                dead += 1;
                continue;
            };
            if is_live(&entry, scanned) && seen.insert((entry.session.clone(), entry.seq)) {
                live.push(entry);
            } else {
                dead += 1;
            }
        }
        if dead > 256 && dead > live.len() {
            let text: String = live.iter().map(Entry::line).collect();
            replace(&path, &text)?;
        }
        Ok(live)
    }

    /// The event of `entry`, read from its journal line; `None` when the line is not the one
    /// the entry names.
    fn event_at(
        &self,
        journals: &mut HashMap<String, File>,
        entry: &Entry,
    ) -> io::Result<Option<Event>> {
        if !journals.contains_key(&entry.session) {
            let path = self.dir.join(format!("{}.jsonl", entry.session));
            match File::open(&path) {
                Ok(file) => {
                    journals.insert(entry.session.clone(), file);
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(err) => return Err(err),
            }
        }
        let Some(file) = journals.get_mut(&entry.session) else {
            return Ok(None);
        };
        if entry.offset > 0 {
            let mut before = [0u8; 1];
            file.seek(SeekFrom::Start(entry.offset - 1))?;
            if file.read_exact(&mut before).is_err() || before[0] != b'\n' {
                return Ok(None);
            }
        } else {
            file.seek(SeekFrom::Start(0))?;
        }
        let mut line = Vec::new();
        BufReader::new(&mut *file).read_until(b'\n', &mut line)?;
        if line.pop() != Some(b'\n') {
            return Ok(None);
        }
        Ok(self
            .decode(&entry.session, &line)
            .filter(|event| event.seq == entry.seq && event.event_id == entry.event_id))
    }
}

/// Whether `entry` describes a line of its session's current file that the records say is
/// indexed.
fn is_live(entry: &Entry, scanned: &Scanned) -> bool {
    scanned
        .sessions
        .get(&entry.session)
        .is_some_and(|s| s.generation == entry.generation && entry.offset < s.end)
}

/// Where `after` is in the order (its key): the first of `entries` (sorted) with that event
/// id (of the session searched, when one is given).
fn cursor(entries: &[Entry], after: &str, filter: &EventFilter) -> Option<(i64, String, u64)> {
    entries
        .iter()
        .find(|e| e.event_id == after && filter.session_id.as_ref().is_none_or(|s| e.session == *s))
        .map(|e| (e.order, e.session.clone(), e.seq))
}

/// The index's files do not read: rebuild them.
#[derive(Debug)]
struct Stale;

fn scanned_line(session: &str, seen: &Seen) -> String {
    format!(
        "scanned {session} {} {} {} {} {} {} {} {} {}\n",
        seen.generation,
        seen.id.0,
        seen.id.1,
        seen.mtime,
        seen.len,
        seen.end,
        seen.print,
        seen.order,
        u8::from(seen.broken)
    )
}

fn parse_scanned(line: &str) -> Option<(String, Seen)> {
    let fields: Vec<&str> = line.split(' ').collect();
    let [
        "scanned",
        session,
        generation,
        dev,
        ino,
        mtime,
        len,
        end,
        print,
        order,
        broken,
    ] = fields.as_slice()
    else {
        return None;
    };
    if !is_safe_id(session) {
        return None;
    }
    Some((
        (*session).to_owned(),
        Seen {
            generation: generation.parse().ok()?,
            id: (dev.parse().ok()?, ino.parse().ok()?),
            mtime: mtime.parse().ok()?,
            len: len.parse().ok()?,
            end: end.parse().ok()?,
            print: print.parse().ok()?,
            order: order.parse().ok()?,
            broken: match *broken {
                "0" => false,
                "1" => true,
                _ => return None,
            },
        },
    ))
}

fn append(path: &Path, text: &str) -> io::Result<()> {
    let mut file = OpenOptions::new().append(true).create(true).open(path)?;
    file.write_all(text.as_bytes())
}

/// Writes `path` anew through a temporary file renamed over it.
fn replace(path: &Path, text: &str) -> io::Result<()> {
    let temporary = path.with_extension("new");
    fs::write(&temporary, text)?;
    fs::rename(&temporary, path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_back_as_written() {
        let entry = Entry {
            session: "s1".into(),
            generation: 3,
            seq: 7,
            offset: 1234,
            order: 1_700_000_000_000_000,
            ts: 1_699_999_999_000_000,
            event_id: "e 1".into(),
            run: "r1".into(),
            category: "tool".into(),
            status: "ok".into(),
            agent: Some("devis agent".into()),
            role: None,
            facets: vec![
                ("tool_name".into(), "a=b,c%d".into()),
                ("model".into(), "x".into()),
            ],
        };
        let line = entry.line();
        assert_eq!(line.matches(' ').count(), 12, "{line}");
        let back = Entry::parse(line.trim_end()).unwrap();
        assert_eq!(back.line(), line);
        assert_eq!(back.facets, entry.facets);
        assert_eq!(back.agent.as_deref(), Some("devis agent"));
        assert!(Entry::parse("s1 3 7").is_none());
    }

    #[test]
    fn odd_types_share_one_file() {
        assert_eq!(type_file("tool.called"), "t.tool.called");
        assert_eq!(type_file("../x"), OTHER_TYPES);
        assert_eq!(type_file(""), OTHER_TYPES);
        assert_eq!(type_file(".hidden"), OTHER_TYPES);
    }

    #[test]
    fn a_scanned_record_reads_back() {
        let seen = Seen {
            generation: 2,
            id: (1, 2),
            mtime: 3,
            len: 4,
            end: 4,
            print: 5,
            order: -6,
            broken: true,
        };
        let line = scanned_line("s1", &seen);
        assert_eq!(
            parse_scanned(line.trim_end()),
            Some(("s1".to_owned(), seen))
        );
        assert_eq!(parse_scanned("scanned ../x 1 1 1 1 1 1 1 1 0"), None);
    }
}
