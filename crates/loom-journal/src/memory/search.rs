//! The memory store's event search: each tenant's events in the order of the appends (the
//! store's write order), with the positions of each type's events, so that a search decodes
//! the events of the types it asks for, and nothing of the others.
//!
//! What it costs: 16 bytes per event for the order (session number, seq), 8 for a hash of its
//! id (a cursor is found without decoding the events before it) and 4 for its type's list,
//! beside the journal lines (a few hundred bytes each, compressed when quiet).

use std::{collections::HashMap, sync::Arc};

use loom_core::{
    event::Event,
    ports::StoreError,
    search::{EventFilter, Searched},
};

use super::journal::{Lines, Unpacked, decode, event_id_of};

/// One tenant's events in write order.
#[derive(Debug, Default)]
pub(super) struct Postings {
    /// Session ids by number.
    sessions: Vec<String>,
    /// Session numbers by id.
    numbers: HashMap<String, u32>,
    /// `(session number, seq)` of every event, in the order of the appends.
    log: Vec<(u32, u64)>,
    /// A hash of each event's id ([`id_hash`]), by position in `log`.
    ids: Vec<u64>,
    /// Positions in `log` of each type's events, ascending.
    by_type: HashMap<String, Vec<u32>>,
}

/// An event a search may read: its position in the tenant's write order, its session number
/// and its seq.
type Spot = (u32, u32, u64);

/// What a search reads once the store's lock is released: the events to look at, in write
/// order, and the lines of the sessions they fall in.
#[derive(Debug)]
pub(super) struct Plan {
    /// The events that may pass.
    candidates: Vec<Spot>,
    /// When the search has a cursor: the events (of the session searched, when given) whose id
    /// hashes as the cursor's, where it is looked for, from the first.
    cursor: Option<Vec<Spot>>,
    /// Session ids by number.
    sessions: Vec<String>,
    /// The lines of each session concerned, by number.
    lines: HashMap<u32, Lines>,
}

impl Postings {
    /// Records events just appended to `session`.
    pub(super) fn add<E: std::borrow::Borrow<Event>>(&mut self, session: &str, events: &[E]) {
        let number = match self.numbers.get(session) {
            Some(number) => *number,
            None => {
                let number = u32::try_from(self.sessions.len()).unwrap_or(u32::MAX);
                self.sessions.push(session.to_owned());
                self.numbers.insert(session.to_owned(), number);
                number
            }
        };
        for event in events.iter().map(std::borrow::Borrow::borrow) {
            let position = u32::try_from(self.log.len()).unwrap_or(u32::MAX);
            self.log.push((number, event.seq));
            self.ids.push(id_hash(&event.event_id));
            // The type is copied once, for its first event.
            match self.by_type.get_mut(&event.event_type) {
                Some(positions) => positions.push(position),
                None => {
                    self.by_type
                        .insert(event.event_type.clone(), vec![position]);
                }
            }
        }
    }

    /// The bytes the postings take (not counting the containers' spare capacity).
    pub(super) fn bytes(&self) -> usize {
        self.log.len() * std::mem::size_of::<(u32, u64)>()
            + self.ids.len() * std::mem::size_of::<u64>()
            + self.by_type.values().map(Vec::len).sum::<usize>() * std::mem::size_of::<u32>()
            + self.sessions.iter().map(String::len).sum::<usize>() * 2
    }

    /// Whether no event is left.
    pub(super) fn is_empty(&self) -> bool {
        self.log.is_empty()
    }

    /// Forgets a deleted session's events.
    pub(super) fn remove(&mut self, session: &str) {
        let Some(number) = self.numbers.get(session).copied() else {
            return;
        };
        let mut kept = Vec::with_capacity(self.log.len());
        let mut ids = Vec::with_capacity(self.log.len());
        let mut moved = vec![u32::MAX; self.log.len()];
        for (position, (entry, id)) in self.log.iter().zip(&self.ids).enumerate() {
            if entry.0 != number {
                moved[position] = u32::try_from(kept.len()).unwrap_or(u32::MAX);
                kept.push(*entry);
                ids.push(*id);
            }
        }
        self.log = kept;
        self.ids = ids;
        for positions in self.by_type.values_mut() {
            *positions = positions
                .iter()
                .map(|&p| moved[p as usize])
                .filter(|&p| p != u32::MAX)
                .collect();
        }
        self.by_type.retain(|_, positions| !positions.is_empty());
    }

    /// What `filter` must read, taken under the store's lock (`lines_of` gives a session's
    /// lines, a few reference counts each).
    pub(super) fn plan(
        &self,
        filter: &EventFilter,
        lines_of: impl Fn(&str) -> Option<Lines>,
    ) -> Plan {
        let session = match &filter.session_id {
            Some(id) => match self.numbers.get(id) {
                Some(number) => Some(*number),
                None => {
                    return Plan {
                        candidates: Vec::new(),
                        cursor: filter.after.as_ref().map(|_| Vec::new()),
                        sessions: Vec::new(),
                        lines: HashMap::new(),
                    };
                }
            },
            None => None,
        };
        let positions: Vec<u32> = if filter.types.is_empty() {
            (0..u32::try_from(self.log.len()).unwrap_or(u32::MAX)).collect()
        } else {
            let mut positions: Vec<u32> = filter
                .types
                .iter()
                .filter_map(|t| self.by_type.get(t))
                .flatten()
                .copied()
                .collect();
            positions.sort_unstable();
            positions.dedup();
            positions
        };
        let spot = |p: u32| {
            let (number, seq) = self.log[p as usize];
            (p, number, seq)
        };
        let candidates: Vec<Spot> = positions
            .into_iter()
            .map(spot)
            .filter(|&(_, number, _)| session.is_none_or(|s| number == s))
            .collect();
        let cursor = filter.after.as_ref().map(|after| {
            let wanted = id_hash(after);
            (0..u32::try_from(self.log.len()).unwrap_or(u32::MAX))
                .filter(|&p| self.ids[p as usize] == wanted)
                .map(spot)
                .filter(|&(_, number, _)| session.is_none_or(|s| number == s))
                .collect::<Vec<Spot>>()
        });
        let mut lines = HashMap::new();
        let concerned = cursor
            .as_ref()
            .unwrap_or(&candidates)
            .iter()
            .chain(&candidates);
        for (_, number, _) in concerned {
            if !lines.contains_key(number)
                && let Some(found) = lines_of(&self.sessions[*number as usize])
            {
                lines.insert(*number, found);
            }
        }
        Plan {
            candidates,
            cursor,
            sessions: self.sessions.clone(),
            lines,
        }
    }
}

/// A hash of an event id (the same in every process: SipHash with fixed keys).
fn id_hash(id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut hasher);
    hasher.finish()
}

impl Plan {
    /// Answers `filter` (see [`Postings::plan`]) away from the store's lock; `None` when a line
    /// is missing or does not read back (the caller's scan then names it).
    pub(super) fn answer(
        self,
        filter: &EventFilter,
        name: impl Fn(&str) -> String,
    ) -> Result<Option<Searched>, StoreError> {
        let mut unpacked: HashMap<u32, Unpacked> = HashMap::new();
        let mut line = |(_, number, seq): Spot| -> Result<Option<(String, Arc<str>)>, StoreError> {
            let session = &self.sessions[number as usize];
            let Some(lines) = self.lines.get(&number) else {
                return Ok(None);
            };
            let found = lines.at(seq, unpacked.entry(number).or_default(), &name(session))?;
            Ok(found.map(|line| (session.clone(), line)))
        };
        // Where the cursor is: the first event of that id, in write order.
        let mut start = 0;
        if let (Some(after), Some(order)) = (&filter.after, &self.cursor) {
            let mut at = None;
            for spot in order {
                let Some((_, text)) = line(*spot)? else {
                    return Ok(None);
                };
                if event_id_of(&text).as_deref() == Some(after.as_str()) {
                    at = Some(spot.0);
                    break;
                }
            }
            let Some(at) = at else {
                return Ok(Some(Searched::UnknownAfter));
            };
            start = self.candidates.partition_point(|&(p, ..)| p <= at);
        }
        let mut found = Vec::new();
        for spot in &self.candidates[start..] {
            if found.len() == filter.limit {
                break;
            }
            let Some((session, text)) = line(*spot)? else {
                return Ok(None);
            };
            let event = match decode(&text, spot.2, &name(&session)) {
                Ok(event) => event,
                Err(_) => return Ok(None),
            };
            if filter.matches(&event) {
                found.push(event);
            }
        }
        Ok(Some(Searched::Found(found)))
    }
}
