//! The events a store decoded last, kept with the text they were decoded from.
//!
//! A run reads the same part of its session several times (when it opens, when it is claimed,
//! when it is driven, when it closes for the snapshot and the compaction check), and parsing an
//! event's JSON is most of what such a read costs on a journal of text (JSONL lines, SQLite
//! rows). A line whose text is, byte for byte, the text an event was decoded from is that event
//! again (the text holds its journal and seq too): it is shared from here (`Arc<Event>`)
//! instead of parsed.
//! Nothing is trusted that the text does not prove: the hash only finds the candidate, the text
//! decides, and the store checks the event against where it read it exactly as a parsed one.
//! The key hashes a text's length, first and last [`SAMPLE`] bytes, not all of it: texts run to
//! tens of kilobytes (a snapshot), and hashing them whole cost as much as a third of a decode.
//! Lines of a journal differ in their first bytes (each names its seq) and their last (its
//! payload's end); two texts that share a key only cost a parse.
//!
//! Bounded by [`MAX_EVENTS`] and [`MAX_TEXT`]: the oldest entries go first.

use std::{
    collections::{HashMap, VecDeque},
    hash::{BuildHasher, Hasher, RandomState},
    sync::{Arc, Mutex},
};

use crate::event::Event;

/// The most events kept.
pub(super) const MAX_EVENTS: usize = 1024;

/// The most bytes of event text kept (an event of more than a sixteenth of it is not kept).
pub(super) const MAX_TEXT: usize = 4 << 20;

/// The bytes hashed at each end of a text for its key (see the module documentation).
pub(super) const SAMPLE: usize = 128;

/// The events decoded last (see the module documentation). Shared by a store's reads; every
/// method takes a short lock.
#[derive(Debug, Default)]
pub struct Decoded {
    state: Mutex<State>,
    hasher: RandomState,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<u64, (String, Arc<Event>)>,
    /// Keys, oldest first, each once.
    order: VecDeque<u64>,
    text: usize,
}

impl Decoded {
    /// The key of `text`: its length, first and last [`SAMPLE`] bytes.
    fn key(&self, text: &str) -> u64 {
        let bytes = text.as_bytes();
        let mut hasher = self.hasher.build_hasher();
        hasher.write_usize(bytes.len());
        match (bytes.get(..SAMPLE), bytes.len().checked_sub(SAMPLE)) {
            (Some(head), Some(tail)) if tail >= SAMPLE => {
                hasher.write(head);
                hasher.write(&bytes[tail..]);
            }
            _ => hasher.write(bytes),
        }
        hasher.finish()
    }

    /// The event decoded from `text`, when it is kept.
    pub fn get(&self, text: &str) -> Option<Arc<Event>> {
        let key = self.key(text);
        let state = self.lock();
        match state.entries.get(&key) {
            Some((kept, event)) if kept == text => Some(Arc::clone(event)),
            _ => None,
        }
    }

    /// Keeps `event`, decoded from `text`.
    pub fn put(&self, text: &str, event: &Arc<Event>) {
        if text.len() > MAX_TEXT / 16 {
            return;
        }
        let key = self.key(text);
        let mut state = self.lock();
        match state
            .entries
            .insert(key, (text.to_owned(), Arc::clone(event)))
        {
            // Replaced: the key keeps its place in the order.
            Some((old, _)) => state.text -= old.len(),
            None => state.order.push_back(key),
        }
        state.text += text.len();
        while state.entries.len() > MAX_EVENTS || state.text > MAX_TEXT {
            let Some(oldest) = state.order.pop_front() else {
                break;
            };
            if let Some((old, _)) = state.entries.remove(&oldest) {
                state.text -= old.len();
            }
        }
    }

    /// Forgets every event (the store erased a journal).
    pub fn clear(&self) {
        let mut state = self.lock();
        state.entries.clear();
        state.order.clear();
        state.text = 0;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every change leaves the state whole: a panic elsewhere cannot leave it half-done.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::Map;

    use super::*;

    /// A `run.started` at `seq` of journal `t/s`, with its line.
    fn event(seq: u64) -> (String, Arc<Event>) {
        let mut event = crate::journal::tests::started(Map::new());
        event.event_id = format!("e{seq}");
        event.seq = seq;
        (event.to_json(), Arc::new(event))
    }

    /// An event is found again only by its exact text.
    #[test]
    fn only_the_same_text_is_found() {
        let decoded = Decoded::default();
        let (text, event) = event(1);
        decoded.put(&text, &event);
        assert_eq!(decoded.get(&text), Some(event.clone()));
        let (other, _) = self::event(2);
        assert_eq!(decoded.get(&other), None);
        let changed = text.replacen(':', ": ", 1);
        assert_ne!(changed, text);
        assert_eq!(decoded.get(&changed), None);
        decoded.clear();
        assert_eq!(decoded.get(&text), None);
    }

    /// The oldest entries go once the bound is passed; the count and the text stay bounded.
    #[test]
    fn the_oldest_go_first() {
        let decoded = Decoded::default();
        let events: Vec<_> = (1..=(MAX_EVENTS as u64 + 10)).map(event).collect();
        for (text, event) in &events {
            decoded.put(text, event);
        }
        // Keeping a kept text again does not count it twice.
        let (last, last_event) = &events[events.len() - 1];
        decoded.put(last, last_event);
        assert_eq!(decoded.get(&events[0].0), None);
        assert!(decoded.get(&events[10].0).is_some());
        assert!(decoded.get(last).is_some());
        let state = decoded.lock();
        assert_eq!(state.entries.len(), MAX_EVENTS);
        let kept: usize = events[10..].iter().map(|(text, _)| text.len()).sum();
        assert_eq!(state.text, kept);
    }

    /// Two long texts that differ only between their sampled ends share a key: the text still
    /// decides, and the one kept last is the one found.
    #[test]
    fn a_shared_key_never_returns_the_other_event() {
        let decoded = Decoded::default();
        let (text, event) = event(1);
        let pad = "x".repeat(2 * SAMPLE);
        let (a, b) = (format!("{text}{pad}a{pad}"), format!("{text}{pad}b{pad}"));
        assert_eq!(decoded.key(&a), decoded.key(&b));
        decoded.put(&a, &event);
        assert_eq!(decoded.get(&b), None);
        assert_eq!(decoded.get(&a), Some(event.clone()));
        let (_, other) = self::event(2);
        decoded.put(&b, &other);
        assert_eq!(decoded.get(&a), None);
        assert_eq!(decoded.get(&b), Some(other));
        // Short texts are hashed whole.
        let (short, _) = self::event(3);
        assert!(short.len() < 2 * SAMPLE || decoded.key(&short) != decoded.key(&text));
    }
}
