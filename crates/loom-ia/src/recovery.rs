//! Runs another process left behind (a crash, a `kill -9`: its lease was never handed back),
//! found by sweeping the journal and resumed here.
//!
//! A [`LeaseWatch`] sweeps every tenant the configuration knows. A root run is *abandoned*
//! when it is open, not paused for a human, not driven by this instance, and either its last
//! `run.claimed` has expired or it was never claimed and its last event is older than one
//! lease (a run another process has just opened is not taken from it before its first claim).
//! Each abandoned run is driven in the background, and its driver takes the lease the usual
//! way: `run.claimed` appended under the journal's optimistic concurrency, so when several
//! processes find the same run only one claim is written and the others stop with a conflict.
//!
//! The first sweep reads every session; later sweeps read only the sessions that changed
//! (their last seq moved) or that hold a run whose lease runs out by now. The session list
//! (one summary per session) is still asked of the journal each time.

use std::{collections::HashMap, time::Duration};

use chrono::{DateTime, Utc};
use loom_core::{Event, Payload, RunState, RunStatus, queue::JobKind};
use loom_engine::RunRef;

use crate::{Loom, LoomError};

/// The shortest time between two sweeps of [`Loom::watch_leases`].
pub const MIN_SWEEP_PERIOD: Duration = Duration::from_secs(1);
/// The longest time between two sweeps of [`Loom::watch_leases`].
pub const MAX_SWEEP_PERIOD: Duration = Duration::from_secs(30);

/// The period of the lease sweep for a lease: half of it, within
/// [`MIN_SWEEP_PERIOD`]..=[`MAX_SWEEP_PERIOD`]. A run abandoned by a crash is resumed at most
/// one lease and one period after its driver's last renewal.
pub fn sweep_period(lease: Duration) -> Duration {
    (lease / 2).clamp(MIN_SWEEP_PERIOD, MAX_SWEEP_PERIOD)
}

/// What a sweep remembers of a session.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// The last seq read.
    last_seq: u64,
    /// When a run of the session may become abandoned without a new event (a lease running
    /// out); `None` when nothing in it can.
    recheck: Option<DateTime<Utc>>,
    /// Where the next read starts (after this seq): before the earliest root run still open,
    /// so that a long session is not read again from its start at each of its writes.
    read_after: u64,
}

/// Sweeps the journal for abandoned runs and resumes them (see the module documentation).
/// Built by [`Loom::lease_watch`]; [`Loom::watch_leases`] runs one periodically.
///
/// It remembers one small record per session of the journal (two seqs and an
/// instant, under the session id), so that a later sweep skips a session that did not change;
/// a session erased from the journal is forgotten at the next sweep.
#[derive(Debug)]
pub struct LeaseWatch {
    loom: Loom,
    tenants: Vec<String>,
    /// By tenant, then session.
    seen: HashMap<String, HashMap<Box<str>, Seen>>,
}

impl LeaseWatch {
    pub(crate) fn new(loom: Loom, tenants: Vec<String>) -> LeaseWatch {
        LeaseWatch {
            loom,
            tenants,
            seen: HashMap::new(),
        }
    }

    /// The time between two sweeps: [`sweep_period`] of `execution.lease`.
    pub fn period(&self) -> Duration {
        sweep_period(self.loom.lease())
    }

    /// How many sessions it remembers (each the journal's: see [`LeaseWatch`]).
    pub fn remembered(&self) -> usize {
        self.seen.values().map(HashMap::len).sum()
    }

    /// One sweep: every abandoned run found is driven in the background; returns them.
    /// A session that cannot be read is skipped with a warning (and read again next time).
    pub async fn sweep(&mut self) -> Result<Vec<RunRef>, LoomError> {
        let mut resumed = Vec::new();
        for tenant in self.tenants.clone() {
            let mut seen = self.seen.remove(&tenant).unwrap_or_default();
            let swept = self.sweep_tenant(&tenant, &mut seen, &mut resumed).await;
            self.seen.insert(tenant, seen);
            swept?;
        }
        Ok(resumed)
    }

    async fn sweep_tenant(
        &self,
        tenant: &str,
        seen: &mut HashMap<Box<str>, Seen>,
        resumed: &mut Vec<RunRef>,
    ) -> Result<(), LoomError> {
        let store = self.loom.store().clone();
        let lease =
            chrono::Duration::from_std(self.loom.lease()).unwrap_or(chrono::Duration::seconds(60));
        let sessions = store.sessions(tenant).await?;
        let now = Utc::now();
        let listed: std::collections::HashSet<&str> =
            sessions.iter().map(|s| s.session_id.as_str()).collect();
        seen.retain(|session, _| listed.contains(&**session));
        for summary in &sessions {
            let before = seen.get(summary.session_id.as_str());
            if let Some(before) = before
                && before.last_seq == summary.last_seq
                && before.recheck.is_none_or(|at| at > now)
            {
                continue;
            }
            // From before the earliest run still open when last read (a journal that shrank was
            // erased and begun again: from its start).
            let after = before
                .filter(|before| before.last_seq <= summary.last_seq)
                .map_or(0, |before| before.read_after);
            let events = match store.read(tenant, &summary.session_id, after).await {
                Ok(events) => events,
                Err(error) => {
                    tracing::warn!(tenant, session = %summary.session_id, %error, "unreadable session skipped");
                    continue;
                }
            };
            let found = examine(&events, now, lease, |run_id| {
                self.loom.is_driving(&RunRef {
                    tenant_id: tenant.to_owned(),
                    session_id: summary.session_id.clone(),
                    run_id: run_id.to_owned(),
                })
            });
            let mut recheck = found.recheck;
            for abandoned in found.abandoned {
                let runtime = match self.loom.agent_runtime(&abandoned.agent, tenant) {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        tracing::warn!(run_id = %abandoned.run_id, %error, "run not recovered: its agent cannot be resolved");
                        continue;
                    }
                };
                let run = RunRef {
                    tenant_id: tenant.to_owned(),
                    session_id: summary.session_id.clone(),
                    run_id: abandoned.run_id,
                };
                match self.loom.job_queue().await {
                    // Through a queue, a run that was claimed has its job (redelivered when its
                    // worker died, or in the dead-letter queue when it kept failing): only a
                    // run never claimed, whose job was lost, is queued again.
                    Ok(Some(_)) if abandoned.claimed => continue,
                    Ok(Some(_)) => {
                        if let Err(error) = self.loom.enqueue_run(JobKind::Run, &run).await {
                            tracing::warn!(run_id = %run.run_id, %error, "abandoned run not queued");
                            continue;
                        }
                    }
                    Ok(None) => self.loom.spawn_drive(run.clone(), runtime),
                    Err(error) => {
                        tracing::warn!(run_id = %run.run_id, %error, "abandoned run not queued");
                        continue;
                    }
                }
                resumed.push(run);
                // Driven now: its claim moves the session on; if the drive writes nothing
                // (it failed before its claim), the next sweep looks again. A run whose
                // sub-runs wait for a human writes nothing either: it waits for new events.
                if !abandoned.waits_for_children {
                    recheck = Some(recheck.map_or(now, |at| at.min(now)));
                }
            }
            let last_seq = events.last().map_or(summary.last_seq, |e| e.seq);
            let read_after = found
                .open_since
                .map_or(last_seq, |seq| seq.saturating_sub(1));
            seen.insert(
                summary.session_id.as_str().into(),
                Seen {
                    last_seq,
                    recheck,
                    read_after,
                },
            );
        }
        Ok(())
    }
}

/// A root run to drive again.
#[derive(Debug, PartialEq)]
struct Abandoned {
    run_id: String,
    agent: String,
    /// Waiting for sub-runs (`waiting_child`): driving it writes nothing while they wait.
    waits_for_children: bool,
    /// Whether a driver ever claimed it.
    claimed: bool,
}

/// What a session's journal says at `now`.
#[derive(Debug, Default, PartialEq)]
struct Examined {
    /// Abandoned root runs, in the order they started.
    abandoned: Vec<Abandoned>,
    /// The earliest instant a run of the session, open and held now, may become abandoned.
    recheck: Option<DateTime<Utc>>,
    /// The seq of the `run.started` of the earliest root run still open (`None`: all closed).
    open_since: Option<u64>,
}

/// Finds the abandoned root runs of one session's journal (see the module documentation).
/// A run waiting for its sub-runs is abandoned when its lease expired (driving it again moves
/// on the children that can), but nothing later makes it abandoned again without new events.
fn examine(
    events: &[Event],
    now: DateTime<Utc>,
    lease: chrono::Duration,
    driving: impl Fn(&str) -> bool,
) -> Examined {
    let mut found = Examined::default();
    let later = |at: DateTime<Utc>, found: &mut Examined| {
        found.recheck = Some(found.recheck.map_or(at, |r| r.min(at)));
    };
    let mut roots: Vec<(&str, u64)> = Vec::new();
    for event in events {
        if matches!(&event.payload, Payload::RunStarted(p) if p.parent_run_id.is_none())
            && !roots.iter().any(|(run, _)| *run == event.run_id)
        {
            roots.push((&event.run_id, event.seq));
        }
    }
    for (run_id, started) in roots {
        let state = RunState::fold(run_id, events);
        // Read again next time from the earliest run that is not closed (one that cannot be
        // folded included: it is looked at again).
        if state.as_ref().map_or(true, |state| !state.finished) {
            found.open_since = Some(found.open_since.map_or(started, |seq| seq.min(started)));
        }
        let Ok(state) = state else {
            continue;
        };
        if state.finished || state.status == RunStatus::Paused {
            continue;
        }
        if driving(run_id) {
            later(now, &mut found);
            continue;
        }
        let free_at = match &state.claim {
            Some(claim) => claim.lease_until,
            None => {
                let last = events
                    .iter()
                    .rev()
                    .find(|e| e.run_id == run_id)
                    .map_or(now, |e| e.ts);
                last + lease
            }
        };
        if free_at > now {
            later(free_at, &mut found);
            continue;
        }
        let Some(agent) = state.agent.clone() else {
            continue;
        };
        found.abandoned.push(Abandoned {
            run_id: run_id.to_owned(),
            agent,
            waits_for_children: state.status == RunStatus::WaitingChild,
            claimed: state.claim.is_some(),
        });
    }
    found
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use loom_core::event::{Envelope, RunClaimed};

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + seconds, 0).unwrap()
    }

    fn event(seq: u64, run: &str, ts: DateTime<Utc>, payload: Payload) -> Event {
        let envelope = Envelope {
            event_id: format!("e{seq}-{run}"),
            ts,
            tenant_id: "default".into(),
            session_id: "s1".into(),
            run_id: run.into(),
            root_run_id: run.into(),
            span_id: "span".into(),
            parent_span_id: None,
            agent: Some("agent".into()),
            role: None,
        };
        let mut event = Event::new(envelope, payload);
        event.seq = seq;
        event
    }

    fn started(seq: u64, run: &str, ts: DateTime<Utc>) -> Vec<Event> {
        let run_started = serde_json::from_value(serde_json::json!({
            "kind": "normal",
            "context": {"tenant_id": "default"}
        }))
        .unwrap();
        let message = serde_json::from_value(serde_json::json!({
            "message": loom_core::Message::user("go")
        }))
        .unwrap();
        vec![
            event(seq, run, ts, Payload::RunStarted(run_started)),
            event(seq + 1, run, ts, Payload::MessageUser(message)),
        ]
    }

    fn claimed(seq: u64, run: &str, ts: DateTime<Utc>, until: DateTime<Utc>) -> Event {
        event(
            seq,
            run,
            ts,
            Payload::RunClaimed(RunClaimed {
                worker_id: "worker-a".into(),
                lease_until: until,
            }),
        )
    }

    const LEASE: i64 = 60;

    fn run(events: &[Event], now: i64, driving: &[&str]) -> Examined {
        examine(events, at(now), chrono::Duration::seconds(LEASE), |id| {
            driving.contains(&id)
        })
    }

    #[test]
    fn a_run_whose_lease_expired_is_abandoned_and_a_live_lease_is_rechecked_when_it_ends() {
        let mut events = started(1, "r1", at(0));
        events.push(claimed(3, "r1", at(1), at(61)));
        let live = run(&events, 30, &[]);
        assert!(live.abandoned.is_empty());
        assert_eq!(live.recheck, Some(at(61)));
        let expired = run(&events, 62, &[]);
        assert_eq!(
            expired.abandoned,
            vec![Abandoned {
                run_id: "r1".into(),
                agent: "agent".into(),
                waits_for_children: false,
                claimed: true,
            }]
        );
        // Driven by this instance: never abandoned, looked at again next time.
        let mine = run(&events, 62, &["r1"]);
        assert!(mine.abandoned.is_empty());
        assert_eq!(mine.recheck, Some(at(62)));
    }

    #[test]
    fn the_next_read_starts_at_the_earliest_open_run() {
        let mut events = started(4, "r1", at(0));
        events.extend(started(9, "r2", at(1)));
        assert_eq!(run(&events, 2, &[]).open_since, Some(4));
        assert_eq!(run(&events[2..], 2, &[]).open_since, Some(9));
        assert_eq!(run(&[], 2, &[]).open_since, None);
    }

    #[test]
    fn a_run_never_claimed_is_left_to_its_opener_for_one_lease() {
        let events = started(1, "r1", at(0));
        let young = run(&events, 10, &[]);
        assert!(young.abandoned.is_empty());
        assert_eq!(young.recheck, Some(at(LEASE)));
        assert_eq!(run(&events, LEASE + 1, &[]).abandoned.len(), 1);
    }

    #[test]
    fn a_lease_handed_back_frees_the_run_at_once() {
        let mut events = started(1, "r1", at(0));
        events.push(claimed(3, "r1", at(5), at(5)));
        assert_eq!(run(&events, 5, &[]).abandoned.len(), 1);
    }
}
