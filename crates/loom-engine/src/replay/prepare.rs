//! A recorded run opened again and driven in the replay's journal: what is checked before
//! ([`prepare`]: refusals, the history copied, the attached files read again), and the drive
//! ([`Prepared::drive`]: outside facts re-applied, recorded decisions settled).

use std::{collections::BTreeSet, sync::Arc};

use loom_core::{
    Event, Payload, approval::Decision, content::BlockKind, event::ApprovalRequested,
    ports::ArtifactStore,
};

use super::{Recording, ReplayError, outside};
use crate::AgentRuntime;

/// A run ready to be re-driven: its recorded events, how it ended, and how it is opened again.
pub(super) struct Prepared {
    pub(super) run_id: String,
    pub(super) recorded: Vec<Event>,
    pub(super) recorded_status: String,
    pub(super) begin: crate::BeginRun,
}

/// Checks that `run_id` of `session` can be re-driven, and copies the session's events before
/// it into `engine`'s journal, which must not hold the session yet.
pub(super) async fn prepare(
    engine: &crate::Engine,
    session: &[Event],
    run_id: &str,
    originals: Option<&dyn ArtifactStore>,
) -> Result<Prepared, ReplayError> {
    let start = session
        .iter()
        .find(|e| e.run_id == run_id && matches!(e.payload, Payload::RunStarted(_)))
        .ok_or_else(|| ReplayError::UnknownRun(run_id.to_owned()))?;
    let Payload::RunStarted(started) = &start.payload else {
        return Err(ReplayError::UnknownRun(run_id.to_owned()));
    };
    if started.parent_run_id.is_some() {
        return Err(ReplayError::SubRun {
            run_id: run_id.to_owned(),
            root_run_id: start.root_run_id.clone(),
        });
    }
    let unsupported = |reason: &str| ReplayError::Unsupported {
        run_id: run_id.to_owned(),
        reason: reason.to_owned(),
    };
    if started.kind != "normal" {
        return Err(unsupported(&format!(
            "it is a {} run, opened by the engine itself",
            started.kind
        )));
    }
    let before: Vec<&Event> = session.iter().filter(|e| e.seq < start.seq).collect();
    let recorded: Vec<Event> = session
        .iter()
        .filter(|e| e.seq >= start.seq && e.root_run_id == run_id)
        .cloned()
        .collect();
    check_replayable(&recorded, run_id)?;
    let recorded_status =
        closing(&recorded, run_id).ok_or_else(|| ReplayError::Open(run_id.to_owned()))?;
    let mut message = recorded
        .iter()
        .find_map(|e| match &e.payload {
            Payload::MessageUser(user) if e.run_id == run_id => Some(user.message.clone()),
            _ => None,
        })
        .ok_or_else(|| unsupported("its journal holds no user message"))?;
    let attachments = attached(&recorded, run_id, originals).await?;
    // The blocks that stand for the attachments are added again when the run is opened.
    message.blocks.retain(|block| match &block.kind {
        BlockKind::Artifact { uri, .. } => !attachments.iter().any(|(u, _)| u == uri),
        _ => true,
    });
    let judges = started
        .judges
        .parse()
        .map_err(|_| unsupported(&format!("unknown judge mode '{}'", started.judges)))?;

    let store = engine.store();
    let held = store
        .last_seq(&start.tenant_id, &start.session_id)
        .await
        .map_err(crate::EngineError::from)?;
    if held > 0 {
        return Err(ReplayError::NotScratch(held));
    }
    for (index, event) in before.iter().enumerate() {
        let seq = u64::try_from(index).unwrap_or(u64::MAX);
        store
            .append(vec![(*event).clone()], seq)
            .await
            .map_err(crate::EngineError::from)?;
    }

    let begin = crate::BeginRun {
        tenant_id: start.tenant_id.clone(),
        session_id: Some(start.session_id.clone()),
        run_id: Some(run_id.to_owned()),
        user_id: started.context.user_id.clone(),
        metadata: started.context.metadata.clone(),
        message,
        judges,
        budget: started.budget.clone(),
        attachments: attachments.into_iter().map(|(_, a)| a).collect(),
        trigger: started.trigger.clone(),
        state: started.state.clone(),
    };
    Ok(Prepared {
        run_id: run_id.to_owned(),
        recorded,
        recorded_status,
        begin,
    })
}

impl Prepared {
    /// Opens the run again in `engine`'s journal and drives `double` to its end: how it ended,
    /// and its events and its sub-runs'.
    ///
    /// What came from outside the run is applied again at its recorded place
    /// ([`mod@outside`]): steering messages and a requested cancellation. A pause for approval,
    /// the root's or a sub-run's, is answered with the decision the journal recorded for that
    /// call, journaled again through [`crate::Engine::settle`], then the run is driven on; a
    /// pause the journal holds no decision for ends the replay there (the comparison names it),
    /// unless `decide` is given: then each request left waiting is decided by it (a variant
    /// replay's [`super::VariantPlan::approvals`]).
    pub(super) async fn drive(
        &self,
        engine: &crate::Engine,
        double: &AgentRuntime,
        book: &Recording,
        decide: Option<&(dyn Fn(&ApprovalRequested) -> Decision + Send + Sync)>,
    ) -> Result<(String, Vec<Event>), ReplayError> {
        let root = crate::RunRef {
            tenant_id: self.begin.tenant_id.clone(),
            session_id: self.begin.session_id.clone().unwrap_or_default(),
            run_id: self.run_id.clone(),
        };
        let facts = outside::facts(&self.recorded, &self.run_id);
        let cancels = outside::Outside::cancels(&facts);
        let mut engine = engine.clone();
        let clock = Arc::new(outside::ReplayClock::new(engine.clock.clone()));
        engine.clock = clock.clone();
        let outside = Arc::new(outside::Outside::new(
            engine.clone(),
            root,
            double.name.clone(),
            crate::Cancel::new(),
            facts,
            clock,
            outside::pins(&self.recorded, double),
        ));
        if cancels {
            book.book().cut = Some(outside.clone());
        }
        engine.store = Arc::new(outside::OutsideStore {
            inner: engine.store.clone(),
            outside: outside.clone(),
        });
        let cancel = outside.cancel().clone();
        let run = engine.begin(double, self.begin.clone(), &()).await?;
        let decisions = recorded_decisions(&self.recorded);
        let mut decided: BTreeSet<&str> = BTreeSet::new();
        let mut expiring = outside::expired(&self.recorded);
        let mut outcome = engine
            .drive_with(&run, double, &(), cancel.clone(), None)
            .await;
        let mut status = None;
        loop {
            let state = match outcome {
                Ok(state) => state,
                // The recorded cancellation closed the run under a pilot still driving it.
                Err(crate::EngineError::RunMoved(_)) if outside.cancelled() => break,
                Err(error) => return Err(error.into()),
            };
            status = Some(state.status);
            if state.finished || state.status.is_terminal() {
                break;
            }
            let mut settled = false;
            for (call_id, decision) in &decisions {
                if decided.contains(call_id.as_str()) {
                    continue;
                }
                match engine.settle(&run, double, Some(call_id), decision).await {
                    Ok(_) => {
                        decided.insert(call_id);
                        settled = true;
                    }
                    // Not waiting (yet): the root's or another sub-run's later request.
                    Err(crate::EngineError::UnknownApproval(_)) => {}
                    Err(error) => return Err(error.into()),
                }
            }
            // A request whose recorded fate is to expire: its deadline passes now.
            if !settled
                && !outside.pass_next_expiry(&tree_events(&engine, &run).await?, &mut expiring)
            {
                // Requests the journal holds no fate for: decided by the plan, if it decides.
                let Some(decide) = decide else { break };
                let events = tree_events(&engine, &run).await?;
                let mut any = false;
                for requested in waiting(&events) {
                    let recorded = decisions.iter().any(|(c, _)| *c == requested.call_id)
                        || expiring.contains(&requested.call_id);
                    if recorded {
                        continue;
                    }
                    let decision = decide(requested);
                    match engine
                        .settle(&run, double, Some(&requested.call_id), &decision)
                        .await
                    {
                        Ok(_) => any = true,
                        Err(crate::EngineError::UnknownApproval(_)) => {}
                        Err(error) => return Err(error.into()),
                    }
                }
                if !any {
                    break;
                }
            }
            outcome = engine
                .drive_with(&run, double, &(), cancel.clone(), None)
                .await;
        }
        outside.finish().await?;
        let events = tree_events(&engine, &run).await?;
        let status = closing(&events, &self.run_id)
            .or_else(|| status.map(|s| s.as_str().to_owned()))
            .unwrap_or_else(|| "open".to_owned());
        Ok((status, events))
    }
}

/// The events of `run`'s tree in `engine`'s journal.
async fn tree_events(
    engine: &crate::Engine,
    run: &crate::RunRef,
) -> Result<Vec<Event>, ReplayError> {
    Ok(engine
        .store()
        .read(&run.tenant_id, &run.session_id, 0)
        .await
        .map_err(crate::EngineError::from)?
        .into_iter()
        .filter(|e| e.root_run_id == run.run_id)
        .collect())
}

/// The approval requests of `events` that no decision nor expiry answered yet.
fn waiting(events: &[Event]) -> Vec<&ApprovalRequested> {
    let answered = |call_id: &str| {
        events.iter().any(|e| match &e.payload {
            Payload::ApprovalGranted(p) => p.call_id == call_id,
            Payload::ApprovalRejected(p) => p.call_id == call_id,
            Payload::ApprovalExpired(p) => p.call_id == call_id,
            _ => false,
        })
    };
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ApprovalRequested(requested) if !answered(&requested.call_id) => {
                Some(requested)
            }
            _ => None,
        })
        .collect()
}

/// The human decisions of a recorded run tree, in journal order, by call id
/// (`approval.granted` with its corrected arguments, `approval.rejected`).
fn recorded_decisions(recorded: &[Event]) -> Vec<(String, Decision)> {
    recorded
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ApprovalGranted(granted) => Some((
                granted.call_id.clone(),
                Decision::Approved {
                    by: granted.by.clone(),
                    reason: granted.reason.clone(),
                    arguments: granted.arguments.clone(),
                },
            )),
            Payload::ApprovalRejected(rejected) => Some((
                rejected.call_id.clone(),
                Decision::Rejected {
                    by: rejected.by.clone(),
                    reason: rejected.reason.clone(),
                },
            )),
            _ => None,
        })
        .collect()
}

/// The files attached to `run_id` (its `artifact.stored` of origin `attachment`), each with its
/// recorded URI, their bytes read from `originals` (the original artifact store): the replay
/// attaches them again. Refused when a file's bytes are not there (a journal exported without
/// its files), naming it.
async fn attached(
    recorded: &[Event],
    run_id: &str,
    originals: Option<&dyn ArtifactStore>,
) -> Result<Vec<(String, crate::Attachment)>, ReplayError> {
    let mut attachments = Vec::new();
    for event in recorded.iter().filter(|e| e.run_id == run_id) {
        let Payload::ArtifactStored(stored) = &event.payload else {
            continue;
        };
        if stored.origin != ATTACHMENT_ORIGIN {
            continue;
        }
        let name = stored.name.clone().unwrap_or_else(|| stored.uri.clone());
        let bytes = match originals {
            Some(store) => store
                .get(&stored.uri)
                .await
                .map_err(crate::EngineError::from)?,
            None => None,
        };
        let bytes = bytes.ok_or_else(|| ReplayError::Unsupported {
            run_id: run_id.to_owned(),
            reason: format!(
                "its attached file '{name}' ({}) is not in the artifact store: replay it \
                 where its files are kept (an exported journal holds no file)",
                stored.uri
            ),
        })?;
        attachments.push((
            stored.uri.clone(),
            crate::Attachment {
                name,
                media_type: stored.media_type.clone(),
                bytes,
            },
        ));
    }
    Ok(attachments)
}

/// The origin of an `artifact.stored` of a file attached to the run's request.
const ATTACHMENT_ORIGIN: &str = "attachment";

/// Refuses a run whose journal shows something a replay cannot re-drive exactly.
fn check_replayable(recorded: &[Event], run_id: &str) -> Result<(), ReplayError> {
    for event in recorded {
        let reason = match &event.payload {
            Payload::ModelFellBack(fell)
                if fell.reason == "circuit_open"
                    && !opened_before(recorded, event, &fell.from_model) =>
            {
                "a model was skipped because its circuit breaker was already open when the run \
                 began, and the breakers' state is not in the journal"
            }
            Payload::RunCancelled(cancelled)
                if cancelled.reason != "requested" && cancelled.reason != "parent" =>
            {
                "a run of its tree was cancelled for a reason the replay does not re-apply"
            }
            _ => continue,
        };
        return Err(ReplayError::Unsupported {
            run_id: run_id.to_owned(),
            reason: reason.to_owned(),
        });
    }
    Ok(())
}

/// Whether the circuit of `model` opened in `recorded` before `event` (a skip the run itself
/// caused, which the replay's fresh breakers reproduce).
fn opened_before(recorded: &[Event], event: &Event, model: &str) -> bool {
    recorded
        .iter()
        .take_while(|e| e.event_id != event.event_id)
        .any(|e| matches!(&e.payload, Payload::CircuitOpened(c) if c.target_kind == "model" && c.target == model))
}

/// How the root run closed (`completed`, `failed`, `cancelled`), `None` while it is open.
fn closing(recorded: &[Event], run_id: &str) -> Option<String> {
    recorded.iter().rev().find_map(|e| {
        if e.run_id != run_id {
            return None;
        }
        match &e.payload {
            Payload::RunCompleted(_) => Some("completed".to_owned()),
            Payload::RunFailed(_) => Some("failed".to_owned()),
            Payload::RunCancelled(_) => Some("cancelled".to_owned()),
            _ => None,
        }
    })
}
