//! One session's journal in the [`MemoryStore`](super::MemoryStore), kept compact.
//!
//! An event is kept as its journal line (the compact JSON of [`Event::to_json`], the same bytes
//! the JSONL store writes) and decoded on read, never as a decoded [`Event`]: a decoded event
//! holds one allocation per string, facet and JSON value, several times its line. The lines of
//! a session that went quiet, and the lines of a tail grown to [`TAIL_LINES`], are compressed
//! together (LZ4) into a [`Block`]; a read decompresses only the blocks after the seq it starts
//! from.
//!
//! LZ4 rather than deflate: the devis run's 17 lines (13.1 KiB) compress to 3.1 KiB instead
//! of 2.4 KiB at deflate's level 1, in a fraction of the time (deflating each finished session
//! took about 45 µs of a run in the `runs` bench, its largest single cost on this journal).
//! Nothing is dropped: every line written is read back, in seq order.
//!
//! The tail of a session still written to also keeps its events decoded (shared, [`Line`]),
//! so that the reads a run makes of its own session while it runs (its window, its snapshot,
//! its result) clone them instead of parsing JSON again; packing drops them with the lines, so
//! a quiet session keeps only its compressed block.
//!
//! Lines and blocks are shared (`Arc`): a read takes them out of the store under its lock
//! ([`Journal::lines`], a few reference counts) and decodes them once the lock is released
//! ([`Lines`]), so that decoding a long session never holds up the other sessions' appends.

use std::{borrow::Cow, sync::Arc};

use chrono::{DateTime, SubsecRound, Utc};
use loom_core::{
    event::{Event, EventReadError},
    ports::StoreError,
};

/// The most lines a tail holds before it is packed, even in a session still written to; a last
/// block of fewer lines is packed again with the next tail.
pub(super) const TAIL_LINES: usize = 256;

/// One session's events: packed blocks, then the tail of lines written since.
#[derive(Debug, Default)]
pub(super) struct Journal {
    /// Packed lines, in seq order, from seq 1.
    blocks: Vec<Block>,
    /// The lines after the last block, one event each.
    tail: Vec<Line>,
    /// The seq of the last event (0: none).
    last_seq: u64,
    /// When the last event was built, as its line says (microseconds).
    updated_at: Option<DateTime<Utc>>,
    /// The store's clock at the last append.
    pub(super) touched: u64,
}

/// A line of the tail: its text, and its event, decoded, while the line is in the tail.
#[derive(Debug, Clone)]
pub(super) struct Line {
    text: Arc<str>,
    /// `None` only for a line put there by hand (a test damaging one): it is decoded on read.
    event: Option<Arc<Event>>,
}

/// Consecutive lines compressed together.
#[derive(Debug, Clone)]
struct Block {
    /// The seq of its first line.
    first_seq: u64,
    /// How many lines it holds (at least one).
    lines: u64,
    /// The bytes of the lines joined by `\n` (a compact JSON line holds none).
    len: usize,
    /// Those bytes, compressed (an LZ4 block).
    packed: Arc<[u8]>,
}

impl Block {
    fn last_seq(&self) -> u64 {
        self.first_seq + self.lines - 1
    }

    /// The block's lines, with their seqs.
    fn unpack(&self, name: &str) -> Result<String, StoreError> {
        let corrupted = |what: String| StoreError::Corrupted {
            path: name.to_owned(),
            line: usize::try_from(self.first_seq).unwrap_or(usize::MAX),
            source: EventReadError::Json(format!(
                "the packed lines {}..={} {what}",
                self.first_seq,
                self.last_seq()
            )),
        };
        let bytes = lz4_flex::block::decompress(&self.packed, self.len)
            .map_err(|error| corrupted(format!("do not decompress: {error}")))?;
        if bytes.len() != self.len {
            return Err(corrupted(format!(
                "decompress to {} bytes, not {}",
                bytes.len(),
                self.len
            )));
        }
        String::from_utf8(bytes).map_err(|error| corrupted(format!("are not UTF-8: {error}")))
    }
}

/// What [`Journal::bytes`] counts: the lines not packed, and the packed blocks.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Bytes {
    pub(super) lines: usize,
    pub(super) packed: usize,
}

impl Journal {
    /// The seq of the last event (0 when empty).
    pub(super) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// When the last event was built, as a read of it says.
    pub(super) fn updated_at(&self) -> Option<DateTime<Utc>> {
        self.updated_at
    }

    /// The bytes the journal's events take, lines and blocks (not counting the containers).
    pub(super) fn bytes(&self) -> Bytes {
        Bytes {
            lines: self.tail.iter().map(|line| line.text.len()).sum(),
            packed: self.blocks.iter().map(|block| block.packed.len()).sum(),
        }
    }

    /// Appends events already given their seqs (following [`Journal::last_seq`]), with their
    /// lines (checked and serialized once, by `loom_core::journal::Batch`); keeps the events
    /// given (copied only when one's timestamp is finer than its line's, and it is shared) and
    /// returns them.
    pub(super) fn push(
        &mut self,
        events: Vec<Arc<Event>>,
        lines: Vec<loom_core::journal::Line>,
    ) -> Vec<Arc<Event>> {
        let mut kept = Vec::with_capacity(events.len());
        for (mut event, line) in events.into_iter().zip(lines) {
            // The event as its line reads back: the line keeps microseconds (`ser_ts`).
            let ts = event.ts.trunc_subsecs(6);
            if event.ts != ts {
                Arc::make_mut(&mut event).ts = ts;
            }
            self.tail.push(Line {
                text: Arc::from(line.into_string()),
                event: Some(Arc::clone(&event)),
            });
            kept.push(event);
        }
        if let Some(last) = kept.last() {
            self.last_seq = last.seq;
            self.updated_at = Some(last.ts);
        }
        if self.tail.len() >= TAIL_LINES {
            self.pack();
        }
        kept
    }

    /// Compresses the tail into a block; a last block smaller than [`TAIL_LINES`] is packed
    /// again with it, so that a session packed a little at a time still compresses as a whole.
    pub(super) fn pack(&mut self) {
        if self.tail.is_empty() {
            return;
        }
        let merged = self
            .blocks
            .last()
            .filter(|block| block.lines < TAIL_LINES as u64)
            .map(|block| block.unpack("memory"));
        let (replaced, first_seq, mut text) = match (merged, self.blocks.last()) {
            (Some(Ok(text)), Some(block)) => (true, block.first_seq, text),
            // A block that does not decompress is left alone (its read says so).
            _ => (false, self.tail_first_seq(), String::new()),
        };
        for line in &self.tail {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&line.text);
        }
        if replaced {
            self.blocks.pop();
        }
        self.blocks.push(Block {
            first_seq,
            lines: self.last_seq + 1 - first_seq,
            len: text.len(),
            packed: Arc::from(lz4_flex::block::compress(text.as_bytes())),
        });
        // Its capacity goes too.
        self.tail = Vec::new();
    }

    /// The seq of the tail's first line.
    fn tail_first_seq(&self) -> u64 {
        self.last_seq + 1 - self.tail.len() as u64
    }

    /// The lines with a seq above `after`, and below `before` when a block can be left out
    /// whole, shared with the journal: decode them with [`Lines`] once the store's lock is
    /// released.
    pub(super) fn lines(&self, after: u64, before: u64) -> Lines {
        let start = self
            .blocks
            .partition_point(|block| block.last_seq() <= after);
        let end = self
            .blocks
            .partition_point(|block| block.first_seq < before);
        let tail_first = self.tail_first_seq();
        let skipped = after.saturating_sub(tail_first - 1);
        Lines {
            after,
            blocks: self
                .blocks
                .get(start..end.max(start))
                .unwrap_or_default()
                .to_vec(),
            tail_first: tail_first + skipped.min(self.tail.len() as u64),
            tail: self
                .tail
                .iter()
                .skip(usize::try_from(skipped).unwrap_or(usize::MAX))
                .cloned()
                .collect(),
        }
    }
}

/// Lines taken out of a [`Journal`], decoded away from the store's lock.
#[derive(Debug)]
pub(super) struct Lines {
    /// Only the events with a greater seq.
    after: u64,
    /// The blocks that may hold some.
    blocks: Vec<Block>,
    /// The seq of `tail`'s first line.
    tail_first: u64,
    /// The tail's lines after `after`.
    tail: Vec<Line>,
}

impl Lines {
    /// The events, decoded and checked (`name` names the journal in errors): those of the tail
    /// shared with the journal, those of the blocks decoded.
    pub(super) fn read(&self, name: &str) -> Result<Vec<Arc<Event>>, StoreError> {
        let mut events = Vec::new();
        for block in &self.blocks {
            let text = block.unpack(name)?;
            for (seq, line) in (block.first_seq..).zip(text.split('\n')) {
                if seq > self.after {
                    events.push(Arc::new(decode(line, seq, name)?));
                }
            }
        }
        for (seq, line) in (self.tail_first..).zip(&self.tail) {
            events.push(match &line.event {
                Some(event) => Arc::clone(event),
                None => Arc::new(decode(&line.text, seq, name)?),
            });
        }
        Ok(events)
    }

    /// The last event whose type is `event_type` and whose seq is below `before_seq`, reading
    /// back from the end and decoding only that event.
    pub(super) fn last_of_type(
        &self,
        event_type: &str,
        before_seq: u64,
        name: &str,
    ) -> Result<Option<Arc<Event>>, StoreError> {
        self.last_where(before_seq, name, |kind, _| kind == event_type)
    }

    /// The seq of the `run.started` of `run_id`, reading back from the end (a run looked up is
    /// usually one of the last) and decoding only that event.
    pub(super) fn run_start(&self, run_id: &str, name: &str) -> Result<Option<u64>, StoreError> {
        Ok(self
            .last_where(u64::MAX, name, |kind, run| {
                kind == "run.started" && run == run_id
            })?
            .map(|event| event.seq))
    }

    /// The last event below `before_seq` whose envelope's type and run id pass `wanted`.
    fn last_where(
        &self,
        before_seq: u64,
        name: &str,
        wanted: impl Fn(&str, &str) -> bool,
    ) -> Result<Option<Arc<Event>>, StoreError> {
        for (index, line) in self.tail.iter().enumerate().rev() {
            let seq = self.tail_first + index as u64;
            if seq < before_seq {
                if let Some(event) = &line.event {
                    if wanted(&event.event_type, &event.run_id) {
                        return Ok(Some(Arc::clone(event)));
                    }
                    continue;
                }
                let head = head_of(&line.text, seq, name)?;
                if wanted(&head.event_type, &head.run_id) {
                    return decode(&line.text, seq, name).map(|e| Some(Arc::new(e)));
                }
            }
        }
        for block in self.blocks.iter().rev() {
            let text = block.unpack(name)?;
            let lines: Vec<(u64, &str)> = (block.first_seq..).zip(text.split('\n')).collect();
            for &(seq, line) in lines.iter().rev() {
                if seq > self.after && seq < before_seq {
                    let head = head_of(line, seq, name)?;
                    if wanted(&head.event_type, &head.run_id) {
                        return decode(line, seq, name).map(|e| Some(Arc::new(e)));
                    }
                }
            }
        }
        Ok(None)
    }
}

/// The lines of a [`Lines`] looked up one at a time by seq ([`Lines::at`]), each block unpacked
/// at most once.
#[derive(Debug, Default)]
pub(super) struct Unpacked {
    /// The lines of each block unpacked so far, by its first seq.
    blocks: std::collections::HashMap<u64, Vec<Arc<str>>>,
}

impl Lines {
    /// Line `seq` (above `after`), `None` when these lines do not hold it.
    pub(super) fn at(
        &self,
        seq: u64,
        unpacked: &mut Unpacked,
        name: &str,
    ) -> Result<Option<Arc<str>>, StoreError> {
        if seq <= self.after {
            return Ok(None);
        }
        if seq >= self.tail_first {
            let index = usize::try_from(seq - self.tail_first).unwrap_or(usize::MAX);
            return Ok(self.tail.get(index).map(|line| line.text.clone()));
        }
        let at = self.blocks.partition_point(|block| block.last_seq() < seq);
        let Some(block) = self.blocks.get(at).filter(|block| block.first_seq <= seq) else {
            return Ok(None);
        };
        let lines = match unpacked.blocks.entry(block.first_seq) {
            std::collections::hash_map::Entry::Occupied(lines) => lines.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let text = block.unpack(name)?;
                slot.insert(text.split('\n').map(Arc::from).collect())
            }
        };
        let index = usize::try_from(seq - block.first_seq).unwrap_or(usize::MAX);
        Ok(lines.get(index).cloned())
    }
}

/// A line's envelope `event_id`, without decoding the rest of it (`None`: not an envelope).
pub(super) fn event_id_of(line: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Id<'a> {
        #[serde(borrow)]
        event_id: Cow<'a, str>,
    }
    serde_json::from_str::<Id<'_>>(line)
        .ok()
        .map(|id| id.event_id.into_owned())
}

/// What is read of a line's envelope without decoding the rest of it.
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(rename = "type", borrow)]
    event_type: Cow<'a, str>,
    #[serde(borrow)]
    run_id: Cow<'a, str>,
}

/// A line's envelope `type` and `run_id`, without decoding the rest of it.
fn head_of<'a>(line: &'a str, seq: u64, name: &str) -> Result<Head<'a>, StoreError> {
    serde_json::from_str::<Head<'_>>(line)
        .map_err(|error| corrupted(name, seq, EventReadError::Json(error.to_string())))
}

/// One line read back as the event of seq `seq`.
pub(super) fn decode(line: &str, seq: u64, name: &str) -> Result<Event, StoreError> {
    let event = Event::from_json(line).map_err(|source| corrupted(name, seq, source))?;
    if event.seq != seq {
        return Err(corrupted(
            name,
            seq,
            EventReadError::Json(format!("the line carries seq {}", event.seq)),
        ));
    }
    Ok(event)
}

fn corrupted(name: &str, seq: u64, source: EventReadError) -> StoreError {
    StoreError::Corrupted {
        path: name.to_owned(),
        line: usize::try_from(seq).unwrap_or(usize::MAX),
        source,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use loom_core::journal::Batch;
    use loom_testkit::conformance::events;

    /// Pushes `batch` after the journal's last seq, as the store does.
    fn push(journal: &mut Journal, batch: Vec<Event>) -> Vec<Event> {
        let mut batch = Batch::check(batch).unwrap().unwrap();
        batch.assign_seq(journal.last_seq());
        let (events, lines) = batch.into_parts();
        let events = events.into_iter().map(Arc::new).collect();
        let kept = journal.push(events, lines);
        kept.iter().map(|event| Event::clone(event)).collect()
    }

    /// What `lines` read, as owned events.
    fn read(lines: Lines) -> Vec<Event> {
        let events = lines.read("s").unwrap();
        events.iter().map(|event| Event::clone(event)).collect()
    }

    fn written(journal: &mut Journal, n: usize) -> Vec<Event> {
        push(journal, events("t", "s", n))
    }

    #[test]
    fn a_session_packed_a_little_at_a_time_keeps_one_block_until_it_is_full() {
        let mut journal = Journal::default();
        let mut all = written(&mut journal, 10);
        journal.pack();
        all.extend(written(&mut journal, 10));
        journal.pack();
        assert_eq!(journal.blocks.len(), 1);
        assert_eq!(journal.blocks[0].lines, 20);
        assert!(journal.tail.is_empty());
        // Packing nothing changes nothing.
        journal.pack();
        assert_eq!(journal.blocks.len(), 1);
        // A full block is not packed again: the next lines start a block of their own.
        all.extend(written(&mut journal, TAIL_LINES));
        assert_eq!(journal.blocks.len(), 1);
        assert_eq!(journal.blocks[0].lines, 20 + TAIL_LINES as u64);
        all.extend(written(&mut journal, 3));
        journal.pack();
        assert_eq!(journal.blocks.len(), 2);
        assert_eq!(read(journal.lines(0, u64::MAX)), all);
        assert_eq!(read(journal.lines(270, u64::MAX)), all[270..]);
        // A read before a seq leaves out the blocks after it.
        assert_eq!(journal.lines(0, 5).blocks.len(), 1);
    }

    /// Sessions of every size pack whole, packed again with what follows.
    #[test]
    fn every_session_packs_whole() {
        let mut sessions: Vec<(Journal, Vec<Event>)> = Vec::new();
        for n in [1, 7, 40, 3] {
            let mut journal = Journal::default();
            let mut all = written(&mut journal, n);
            journal.pack();
            all.extend(written(&mut journal, 2));
            journal.pack();
            sessions.push((journal, all));
        }
        for (journal, all) in &sessions {
            assert_eq!(journal.blocks.len(), 1);
            assert_eq!(read(journal.lines(0, u64::MAX)), *all);
        }
    }

    /// The events the tail keeps decoded are those its lines decode to, nanoseconds included.
    #[test]
    fn the_tail_reads_what_its_lines_decode_to() {
        let mut journal = Journal::default();
        let mut batch = events("t", "s", 3);
        for event in &mut batch {
            event.ts += chrono::Duration::nanoseconds(123);
        }
        push(&mut journal, batch.clone());
        let hot = read(journal.lines(0, u64::MAX));
        let decoded: Vec<Event> = journal
            .tail
            .iter()
            .zip(1..)
            .map(|(line, seq)| decode(&line.text, seq, "s").unwrap())
            .collect();
        assert_eq!(hot, decoded);
        assert_ne!(hot[0].ts, batch[0].ts, "the line keeps microseconds");
        journal.pack();
        assert_eq!(read(journal.lines(0, u64::MAX)), hot);
        let last = journal
            .lines(0, u64::MAX)
            .last_of_type(&hot[2].event_type, 3, "s");
        assert_eq!(last.unwrap().as_deref(), Some(&hot[1]));
    }

    #[test]
    fn damaged_lines_are_reported_with_their_seq() {
        let mut journal = Journal::default();
        written(&mut journal, 3);
        journal.tail[1] = Line {
            text: Arc::from("{\"not\": \"an event\"}"),
            event: None,
        };
        match journal.lines(0, u64::MAX).read("memory:t/s") {
            Err(StoreError::Corrupted { path, line, .. }) => {
                assert_eq!((path.as_str(), line), ("memory:t/s", 2));
            }
            other => panic!("expected a corrupted line, got {other:?}"),
        }
        journal.pack();
        let block = &mut journal.blocks[0];
        block.packed = Arc::from(&b"not packed"[..]);
        assert!(matches!(
            journal.lines(0, u64::MAX).read("memory:t/s"),
            Err(StoreError::Corrupted { line: 1, .. })
        ));
        // A block of another length than it says, or whose bytes are not text, is refused too.
        let refusal = |journal: &Journal| match journal.lines(0, u64::MAX).read("memory:t/s") {
            Err(StoreError::Corrupted {
                line: 1, source, ..
            }) => source.to_string(),
            other => panic!("expected a corrupted block, got {other:?}"),
        };
        let block = &mut journal.blocks[0];
        block.packed = Arc::from(lz4_flex::block::compress(b"{}"));
        block.len = 3;
        assert!(refusal(&journal).contains("decompress to 2 bytes, not 3"));
        let block = &mut journal.blocks[0];
        block.packed = Arc::from(lz4_flex::block::compress(&[0xff, 0xfe]));
        block.len = 2;
        assert!(refusal(&journal).contains("are not UTF-8"));
    }
}
