//! Group commit for the JSONL store: the syncs that concurrent appends ask for at the same
//! time are made by one of them, with one flush of the disk when the filesystem allows it.
//!
//! Each session is its own file, so concurrent runs' appends cannot share one `fdatasync`; and
//! measured on ext4, 100 runs at once still cost 2.6 cache flushes of the disk per run (each
//! `fdatasync` sends its own), against 0.13 for SQLite's group commit (`bench/README.md`). So an
//! append that must be durable hands its file (and, for a new file, its directory) to
//! [`GroupSync::sync`], which blocks until a sync that covers them has returned:
//!
//! - the first caller to find no sync running becomes the leader: it takes every file queued
//!   so far (its own included) and syncs them, then answers all of them;
//! - callers arriving meanwhile queue for the next group, whose leader is the first of them to
//!   wake once the running sync returns.
//!
//! A group of one caller is synced with that caller's own syncs (`fdatasync` of the journal,
//! `fsync` of a directory), exactly as without grouping, so one run after another pays what it
//! paid before. A group of several callers is synced, on Linux, with one `syncfs` per
//! filesystem it touches: the filesystem's journal
//! commits every file's data and size together and the disk is flushed once. `syncfs` also
//! writes what other writers left dirty on that filesystem, so a journal root shares its
//! filesystem with heavy writers at the cost of their writeback; elsewhere than Linux each file
//! is synced on its own. An append waits for the sync of its group while holding its file's
//! lock, as before: no other append of the session can follow it before it is durable, and a
//! failed sync still truncates it back.

use std::{
    fs::File,
    io, mem,
    sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError},
};

/// One file to make durable: a journal file (its data, `fdatasync`) or a directory (its
/// entries, `fsync`).
#[derive(Debug)]
pub(crate) struct ToSync {
    /// A handle of its own (the leader syncs it from another thread).
    pub(crate) file: File,
    /// A directory, whose new entry must be durable.
    pub(crate) directory: bool,
}

/// The outcome of one group, shared by its members.
#[derive(Debug, Default)]
struct Outcome {
    result: OnceLock<Result<(), (io::ErrorKind, String)>>,
}

#[derive(Debug, Default)]
struct State {
    /// The files of the group being collected, by caller.
    queued: Vec<Vec<ToSync>>,
    /// The outcome the group being collected will have.
    open: Arc<Outcome>,
    /// Whether a leader is syncing a group.
    leading: bool,
    /// Groups synced, and syncs made (a `syncfs` or one file's sync), for tests and benches.
    groups: u64,
    syncs: u64,
}

/// The group commit of one store (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct GroupSync {
    state: Mutex<State>,
    done: Condvar,
}

impl GroupSync {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes `files` durable: returns once a sync that covers all of them has returned, with
    /// its error if it failed.
    pub(crate) fn sync(&self, files: Vec<ToSync>) -> io::Result<()> {
        if files.is_empty() {
            return Ok(());
        }
        let mut state = self.lock();
        state.queued.push(files);
        let mine = Arc::clone(&state.open);
        loop {
            if let Some(result) = mine.result.get() {
                return result
                    .clone()
                    .map_err(|(kind, message)| io::Error::new(kind, message));
            }
            if state.leading {
                state = self
                    .done
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            // Lead the group collected so far (ours, or a later one when ours is done).
            let group = mem::take(&mut state.queued);
            let outcome = mem::take(&mut state.open);
            state.leading = true;
            drop(state);
            let (result, syncs) = flush(&group);
            drop(group);
            let _ = outcome
                .result
                .set(result.map_err(|error| (error.kind(), error.to_string())));
            state = self.lock();
            state.leading = false;
            state.groups += 1;
            state.syncs += syncs;
            self.done.notify_all();
        }
    }

    /// `(groups synced, syncs made)` so far.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (u64, u64) {
        let state = self.lock();
        (state.groups, state.syncs)
    }
}

/// Syncs `group` (the files of each caller), returning the first error and how many syncs
/// were made.
fn flush(group: &[Vec<ToSync>]) -> (io::Result<()>, u64) {
    if let [alone] = group {
        return each(alone);
    }
    flush_many(group.iter().flatten())
}

/// Each file its own sync.
fn each<'a>(files: impl IntoIterator<Item = &'a ToSync>) -> (io::Result<()>, u64) {
    let mut result = Ok(());
    let mut syncs = 0;
    for one in files {
        syncs += 1;
        let synced = sync_one(one);
        if result.is_ok() {
            result = synced;
        }
    }
    (result, syncs)
}

/// One file's own sync.
fn sync_one(one: &ToSync) -> io::Result<()> {
    if one.directory {
        one.file.sync_all()
    } else {
        one.file.sync_data()
    }
}

/// The files of several callers: one `syncfs` per filesystem they are on.
#[cfg(target_os = "linux")]
fn flush_many<'a>(group: impl Iterator<Item = &'a ToSync>) -> (io::Result<()>, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut devices: Vec<u64> = Vec::new();
    let mut syncs = 0;
    let mut result = Ok(());
    for one in group {
        let synced = match one.file.metadata() {
            Ok(meta) if devices.contains(&meta.dev()) => Ok(()),
            Ok(meta) => {
                devices.push(meta.dev());
                syncs += 1;
                nix::unistd::syncfs(&one.file).map_err(io::Error::from)
            }
            // Its filesystem unknown: the file's own sync.
            Err(_) => {
                syncs += 1;
                sync_one(one)
            }
        };
        if result.is_ok() {
            result = synced;
        }
    }
    (result, syncs)
}

/// The files of several callers: each its own sync.
#[cfg(not(target_os = "linux"))]
fn flush_many<'a>(group: impl Iterator<Item = &'a ToSync>) -> (io::Result<()>, u64) {
    each(group)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::{io::Write, sync::Barrier, thread};

    use super::*;

    fn file(dir: &std::path::Path, name: &str) -> File {
        let mut file = File::create(dir.join(name)).unwrap();
        file.write_all(b"line\n").unwrap();
        file
    }

    /// What an append to a new journal file `name` in `dir` hands the syncer.
    fn new_journal(dir: &std::path::Path, name: &str) -> Vec<ToSync> {
        vec![
            ToSync {
                file: file(dir, name),
                directory: false,
            },
            ToSync {
                file: File::open(dir).unwrap(),
                directory: true,
            },
        ]
    }

    #[test]
    fn a_caller_alone_is_synced_as_without_grouping() {
        let dir = tempfile::tempdir().unwrap();
        let group = GroupSync::default();
        for n in 0..3 {
            let file = file(dir.path(), &format!("{n}.jsonl"));
            group
                .sync(vec![ToSync {
                    file,
                    directory: false,
                }])
                .unwrap();
        }
        assert_eq!(group.counts(), (3, 3));
        group.sync(Vec::new()).unwrap();
        assert_eq!(group.counts(), (3, 3));
        // A caller alone: its file and its directory, each its own sync.
        group.sync(new_journal(dir.path(), "new.jsonl")).unwrap();
        assert_eq!(group.counts(), (4, 5));
    }

    #[test]
    fn concurrent_syncs_share_groups_and_every_caller_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let group = Arc::new(GroupSync::default());
        let callers = 32;
        let start = Arc::new(Barrier::new(callers));
        let threads: Vec<_> = (0..callers)
            .map(|n| {
                let files = new_journal(dir.path(), &format!("{n}.jsonl"));
                let (group, start) = (Arc::clone(&group), Arc::clone(&start));
                thread::spawn(move || {
                    start.wait();
                    group.sync(files)
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap().unwrap();
        }
        let (groups, syncs) = group.counts();
        // Each caller is answered by the group it joined or an earlier one: a group of one
        // caller is its two syncs, a group of several one `syncfs` on Linux (one filesystem).
        assert!(groups >= 1 && groups <= callers as u64, "{groups}");
        if cfg!(target_os = "linux") {
            assert!(
                (groups..=2 * groups).contains(&syncs),
                "{groups} groups, {syncs} syncs"
            );
        } else {
            assert_eq!(syncs, 2 * callers as u64);
        }
    }

    #[test]
    fn a_failed_sync_is_reported_to_its_callers() {
        // A pipe cannot be synced (`EINVAL`).
        let dir = tempfile::tempdir().unwrap();
        let group = GroupSync::default();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if !made.is_ok_and(|status| status.success()) {
            eprintln!("skipped: no mkfifo here");
            return;
        }
        // Opened read-write so the open does not wait for a writer.
        let pipe = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        let error = group
            .sync(vec![ToSync {
                file: pipe,
                directory: false,
            }])
            .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{error}");
    }
}
