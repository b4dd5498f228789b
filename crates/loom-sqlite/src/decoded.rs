//! The events a store decoded last, kept with the text they were decoded from.
//!
//! A run reads the same part of its session several times (when it opens, at each model call
//! for its history, when it closes for the snapshot and the compaction check), and parsing an
//! event's JSON is most of what such a read costs. A row whose text is, byte for byte, the text
//! an event was decoded from is that event again: it is cloned from here instead of parsed.
//! Nothing is trusted that the text does not prove: the key only finds the candidate, the
//! text decides, and the caller checks the event against its row exactly as a parsed one.
//!
//! Bounded by [`MAX_EVENTS`] and [`MAX_TEXT`]: the oldest entries go first.

use std::{
    collections::{HashMap, VecDeque},
    hash::{BuildHasher, RandomState},
    sync::Mutex,
};

use loom_core::event::Event;

/// The most events kept.
pub(crate) const MAX_EVENTS: usize = 1024;

/// The most bytes of event text kept.
pub(crate) const MAX_TEXT: usize = 4 << 20;

/// The events decoded last (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Decoded {
    state: Mutex<State>,
    hasher: RandomState,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<u64, (String, Event)>,
    /// Keys, oldest first, each once.
    order: VecDeque<u64>,
    text: usize,
}

impl Decoded {
    /// The event decoded from `text` at `seq` of the journal, when it is kept.
    pub(crate) fn get(
        &self,
        tenant_id: &str,
        session_id: &str,
        seq: u64,
        text: &str,
    ) -> Option<Event> {
        let key = self.key(tenant_id, session_id, seq);
        let state = self.lock();
        match state.entries.get(&key) {
            Some((kept, event)) if kept == text => Some(event.clone()),
            _ => None,
        }
    }

    /// Keeps `event`, decoded from `text` at `seq` of the journal.
    pub(crate) fn put(
        &self,
        tenant_id: &str,
        session_id: &str,
        seq: u64,
        text: &str,
        event: &Event,
    ) {
        if text.len() > MAX_TEXT / 16 {
            return;
        }
        let key = self.key(tenant_id, session_id, seq);
        let mut state = self.lock();
        match state.entries.insert(key, (text.to_owned(), event.clone())) {
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
    pub(crate) fn clear(&self) {
        let mut state = self.lock();
        state.entries.clear();
        state.order.clear();
        state.text = 0;
    }

    fn key(&self, tenant_id: &str, session_id: &str, seq: u64) -> u64 {
        self.hasher.hash_one((tenant_id, session_id, seq))
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
    use super::*;

    fn event(seq: u64) -> (String, Event) {
        let mut event = loom_testkit::conformance::event("t", "s", "a");
        event.seq = seq;
        (event.to_json(), event)
    }

    /// An event is found again only by its journal, seq and exact text.
    #[test]
    fn only_the_same_text_at_the_same_place_is_found() {
        let decoded = Decoded::default();
        let (text, event) = event(1);
        decoded.put("t", "s", 1, &text, &event);
        assert_eq!(decoded.get("t", "s", 1, &text), Some(event.clone()));
        assert_eq!(decoded.get("t", "s", 2, &text), None);
        assert_eq!(decoded.get("t", "other", 1, &text), None);
        assert_eq!(decoded.get("u", "s", 1, &text), None);
        let changed = text.replacen("\"seq\":1", "\"seq\":1 ", 1);
        assert_ne!(changed, text);
        assert_eq!(decoded.get("t", "s", 1, &changed), None);
        decoded.clear();
        assert_eq!(decoded.get("t", "s", 1, &text), None);
    }

    /// The oldest entries go once the bound is passed; the count and the text stay bounded.
    #[test]
    fn the_oldest_go_first() {
        let decoded = Decoded::default();
        let (text, event) = event(1);
        for seq in 1..=(MAX_EVENTS as u64 + 10) {
            decoded.put("t", "s", seq, &text, &event);
        }
        // Replacing a kept entry does not count it twice.
        decoded.put("t", "s", MAX_EVENTS as u64 + 10, &text, &event);
        assert_eq!(decoded.get("t", "s", 1, &text), None);
        assert!(decoded.get("t", "s", 11, &text).is_some());
        assert!(
            decoded
                .get("t", "s", MAX_EVENTS as u64 + 10, &text)
                .is_some()
        );
        let state = decoded.lock();
        assert_eq!(state.entries.len(), MAX_EVENTS);
        assert_eq!(state.text, MAX_EVENTS * text.len());
    }
}
