//! Sessions as callers see them: one session's runs and waiting approvals
//! ([`Loom::session`]), its files ([`Loom::session_files`], [`Loom::session_file`]), the agents
//! of a run tree ([`Loom::tree_agents`]), and what a GDPR erasure removed
//! ([`SessionDeletion`]). All are read from the session's journal.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use loom_core::{
    Event, RunState, RunStatus, Usage, approval::PendingApproval, event::Payload, ids::is_safe_id,
};
use loom_engine::RunRef;
use serde::{Deserialize, Serialize};

use crate::{DEFAULT_TENANT, Loom, LoomError};

/// The file origins `artifact.stored` records.
pub const FILE_ORIGINS: [&str; 3] = ["attachment", "tool_output", "offload"];

/// A session as listed (`loom sessions list`, `GET /v1/sessions`, `loom://sessions`), the
/// most recently written first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SessionListed {
    /// Session.
    pub session_id: String,
    /// Seq of its last event (its number of events).
    pub last_seq: u64,
    /// When its last event was written (`null` when the journal does not say).
    #[serde(default, with = "opt_rfc3339")]
    #[schemars(with = "Option<DateTime<Utc>>")]
    pub updated_at: Option<DateTime<Utc>>,
}

impl From<loom_core::ports::SessionSummary> for SessionListed {
    fn from(summary: loom_core::ports::SessionSummary) -> SessionListed {
        SessionListed {
            session_id: summary.session_id,
            last_seq: summary.last_seq,
            updated_at: summary.updated_at,
        }
    }
}

/// A session: its runs in the order they started, and the approvals waiting in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SessionInfo {
    /// Session.
    pub session_id: String,
    /// Seq of its last event (its number of events).
    pub last_seq: u64,
    /// When its last event was written.
    #[serde(default, with = "opt_rfc3339")]
    #[schemars(with = "Option<DateTime<Utc>>")]
    pub updated_at: Option<DateTime<Utc>>,
    /// Its runs (sub-runs included), in the order they started.
    pub runs: Vec<SessionRun>,
    /// The approval requests waiting for a decision, run by run.
    pub pending_approvals: Vec<PendingApproval>,
}

/// One run of a [`SessionInfo`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SessionRun {
    /// Run.
    pub run_id: String,
    /// Its agent.
    pub agent: String,
    /// Its state.
    pub status: RunStatus,
    /// The run that opened it (sub-agent runs).
    pub parent_run_id: Option<String>,
    /// Orchestrator model calls.
    pub iterations: u32,
    /// Tokens of every model call of the run.
    pub usage: Usage,
    /// Cost in dollars.
    pub cost_usd: f64,
    /// Left unfinished with nobody driving it: not closed, not waiting for a human, and no live
    /// lease on its run tree (`Loom::resume` or `Loom::recover` takes it up again).
    pub unpiloted: bool,
}

/// A file stored beside a session's journal (`artifact.stored`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SessionFile {
    /// The file's name in its URI (`<sha256>.<ext>`), which names it in
    /// `GET /sessions/{id}/files/{file}`.
    pub file: String,
    /// `artifact://<tenant>/<session>/<file>`.
    pub uri: String,
    /// Display name (an attachment's file name), if any.
    #[serde(default)]
    pub name: Option<String>,
    /// MIME type.
    pub media_type: String,
    /// Bytes.
    pub size: u64,
    /// `attachment`, `tool_output` or `offload`.
    pub origin: String,
    /// The run that stored it.
    pub run_id: String,
    /// The tool call that produced it, if any.
    #[serde(default)]
    pub call_id: Option<String>,
    /// When it was stored.
    #[serde(with = "crate::query::rfc3339")]
    #[schemars(with = "DateTime<Utc>")]
    pub stored_at: DateTime<Utc>,
}

/// What erasing a session removed ([`Loom::delete_session`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SessionDeletion {
    /// The session erased.
    pub session_id: String,
    /// Events of its journal.
    pub events_deleted: u64,
    /// Files stored beside it.
    pub files_deleted: u64,
    /// Idempotency records its runs made (0 without an idempotency store).
    pub idempotency_keys_deleted: u64,
}

mod opt_rfc3339 {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        ts: &Option<DateTime<Utc>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match ts {
            Some(ts) => crate::query::rfc3339::serialize(ts, s),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<DateTime<Utc>>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => DateTime::parse_from_rfc3339(&text)
                .map(|t| Some(t.with_timezone(&Utc)))
                .map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}

/// The runs of a journal in the order they started (the runs a `run.started` opens), folded.
pub(crate) fn folded(events: &[Event]) -> Result<Vec<RunState>, LoomError> {
    let by_run = crate::journals::by_run(events);
    crate::journals::started_runs(events)
        .into_iter()
        .map(|run_id| {
            crate::journals::fold(run_id, &by_run)
                .map_err(|e| LoomError::from(loom_engine::EngineError::Fold(e)))
        })
        .collect()
}

/// Whether a root run is left without a driver at `now`: not closed, not waiting for a human
/// (paused, or waiting for a sub-run that is), and its lease gone or expired.
fn unpiloted(root: &RunState, now: DateTime<Utc>) -> bool {
    !root.finished
        && !root.status.is_terminal()
        && !matches!(root.status, RunStatus::Paused | RunStatus::WaitingChild)
        && root.claim.as_ref().is_none_or(|c| c.lease_until <= now)
}

impl Loom {
    /// A session's events, in journal order. [`LoomError::UnknownSession`] when the tenant
    /// has no such session (or the id cannot name one).
    pub async fn session_events(
        &self,
        session: &str,
        tenant: Option<&str>,
    ) -> Result<Vec<Event>, LoomError> {
        let tenant = tenant.unwrap_or(DEFAULT_TENANT);
        if !is_safe_id(session) {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let events = self.event_store().read(tenant, session, 0).await?;
        if events.is_empty() {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        Ok(events)
    }

    /// A session: its runs in the order they started (sub-runs included) and the approvals
    /// waiting for a decision. [`LoomError::UnknownSession`] when the tenant has no such
    /// session.
    pub async fn session(
        &self,
        session: &str,
        tenant: Option<&str>,
    ) -> Result<SessionInfo, LoomError> {
        let events = self.session_events(session, tenant).await?;
        let states = folded(&events)?;
        let now = Utc::now();
        let roots: BTreeMap<&str, bool> = states
            .iter()
            .filter(|s| s.parent_run_id.is_none())
            .map(|s| (s.run_id.as_str(), unpiloted(s, now)))
            .collect();
        let runs = states
            .iter()
            .map(|state| SessionRun {
                run_id: state.run_id.clone(),
                agent: state.agent.clone().unwrap_or_default(),
                status: state.status,
                parent_run_id: state.parent_run_id.clone(),
                iterations: state.iterations,
                usage: state.usage,
                cost_usd: state.cost_usd,
                // A sub-run is driven by its root's driver: it is left alone when its root is.
                unpiloted: !state.status.is_terminal()
                    && roots
                        .get(state.root_run_id.as_str())
                        .copied()
                        .unwrap_or(false),
            })
            .collect();
        let last = events.last();
        Ok(SessionInfo {
            session_id: session.to_owned(),
            last_seq: last.map_or(0, |e| e.seq),
            updated_at: last.map(|e| e.ts),
            runs,
            pending_approvals: states
                .iter()
                .flat_map(RunState::pending_approvals)
                .collect(),
        })
    }

    /// The files stored beside a session (`artifact.stored`, each once, in the order they were
    /// stored), only those of `origins` when it is not empty.
    /// [`LoomError::UnknownSession`] when the tenant has no such session.
    pub async fn session_files(
        &self,
        session: &str,
        origins: &[String],
        tenant: Option<&str>,
    ) -> Result<Vec<SessionFile>, LoomError> {
        let events = self.session_events(session, tenant).await?;
        let tenant = tenant.unwrap_or(DEFAULT_TENANT);
        let prefix = format!("artifact://{tenant}/{session}/");
        let mut files: Vec<SessionFile> = Vec::new();
        for event in &events {
            let Payload::ArtifactStored(stored) = &event.payload else {
                continue;
            };
            // Only the session's own files: nothing in a journal can point at another's.
            let Some(file) = stored.uri.strip_prefix(&prefix) else {
                continue;
            };
            if files.iter().any(|f| f.uri == stored.uri)
                || (!origins.is_empty() && !origins.contains(&stored.origin))
            {
                continue;
            }
            files.push(SessionFile {
                file: file.to_owned(),
                uri: stored.uri.clone(),
                name: stored.name.clone(),
                media_type: stored.media_type.clone(),
                size: stored.size,
                origin: stored.origin.clone(),
                run_id: event.run_id.clone(),
                call_id: stored.call_id.clone(),
                stored_at: event.ts,
            });
        }
        Ok(files)
    }

    /// One file of a session (`file` as [`SessionFile::file`] names it) and its bytes.
    /// [`LoomError::UnknownSession`] when the tenant has no such session,
    /// [`LoomError::UnknownArtifact`] when the session stored no such file or its bytes are
    /// gone (a memory artifact store does not outlive its process).
    pub async fn session_file(
        &self,
        session: &str,
        file: &str,
        tenant: Option<&str>,
    ) -> Result<(SessionFile, Vec<u8>), LoomError> {
        let files = self.session_files(session, &[], tenant).await?;
        let unknown = || LoomError::UnknownArtifact(format!("{file} of session {session}"));
        let found = files
            .into_iter()
            .find(|f| f.file == file)
            .ok_or_else(unknown)?;
        let store = self.artifact_store().ok_or_else(unknown)?;
        let bytes = store.get(&found.uri).await?.ok_or_else(unknown)?;
        Ok((found, bytes))
    }

    /// The agents of `run` and of every run it opened, down its tree (what a key limited to
    /// some agents must all be allowed to read its trace); for a run of the internal agent
    /// `_compaction`, the agents of the session's runs it summarizes. [`LoomError::UnknownRun`]
    /// when the session holds no such run.
    pub async fn tree_agents(&self, run: &RunRef) -> Result<BTreeSet<String>, LoomError> {
        let events = self.read_run(run).await?;
        let mut tree: BTreeSet<&str> = BTreeSet::new();
        let mut agents = BTreeSet::new();
        for event in &events {
            if let Payload::RunStarted(started) = &event.payload {
                let opened_by_tree = started
                    .parent_run_id
                    .as_deref()
                    .is_some_and(|p| tree.contains(p));
                if event.run_id == run.run_id || opened_by_tree {
                    tree.insert(&event.run_id);
                    if let Some(agent) = &event.agent {
                        agents.insert(agent.clone());
                    }
                }
            }
        }
        if !tree.contains(run.run_id.as_str()) {
            return Err(LoomError::UnknownRun(run.run_id.clone()));
        }
        if agents.remove(loom_engine::COMPACTION_AGENT) {
            // A compaction run reads the session's conversation: it is the session's agents'.
            for event in &events {
                if let Payload::RunStarted(started) = &event.payload
                    && started.kind == "normal"
                    && let Some(agent) = &event.agent
                {
                    agents.insert(agent.clone());
                }
            }
        }
        Ok(agents)
    }
}
