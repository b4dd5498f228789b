//! Reads: where a run is ([`Loom::locate`], [`Loom::address`]), its events, state and result,
//! and the sessions of a tenant (list, runs, export, deletion).

use super::{DEFAULT_TENANT, Loom};
use crate::{LoomError, RunResult, SessionListed};
use loom_core::{Event, RunState};
use loom_engine::RunRef;

impl Loom {
    /// A run as a client addresses it by id (REST's `GET /runs/{run_id}`, MCP's `run_status`,
    /// `run_report` and run resources): in `session` when given, else in the session named after
    /// it (a run opened without a session). As in the reference, a run of a named session asked
    /// without its session is unknown ([`LoomError::UnknownRun`]), so a run id alone does not
    /// reach into another conversation; [`Loom::locate`] is the lookup that searches the
    /// tenant's sessions.
    pub async fn address(
        &self,
        run_id: &str,
        session: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<RunRef, LoomError> {
        if session.is_none() && !loom_core::ids::is_safe_id(run_id) {
            // No session can be named after it: no run of a session of its own.
            return Err(LoomError::UnknownRun(run_id.to_owned()));
        }
        self.locate(run_id, Some(session.unwrap_or(run_id)), tenant)
            .await
    }

    /// Finds a run: in `session` when given, else through the journal's run index
    /// ([`EventStore::find_run`]: an unknown run costs no read of the tenant's sessions). The
    /// session found is read (from the run's start, when the store's run index tells where it
    /// is): when its journal is corrupted, the error says where
    /// ([`LoomError::Journal`], "corrupted at `<file>:<line>`"), not that the run is unknown.
    ///
    /// [`EventStore::find_run`]: loom_core::ports::EventStore::find_run
    pub async fn locate(
        &self,
        run_id: &str,
        session: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<RunRef, LoomError> {
        let tenant = tenant.unwrap_or(DEFAULT_TENANT).to_owned();
        let store = self.inner.engine.store();
        let session_id = match session {
            Some(session) if !loom_core::ids::is_safe_id(session) => {
                return Err(LoomError::Invalid(format!(
                    "session id '{session}' is not usable"
                )));
            }
            Some(session) => session.to_owned(),
            None if !loom_core::ids::is_safe_id(run_id) => {
                return Err(LoomError::UnknownRun(run_id.to_owned()));
            }
            None => match store.find_run(&tenant, run_id).await? {
                Some(session) => session,
                None => return Err(LoomError::UnknownRun(run_id.to_owned())),
            },
        };
        // From the run's start when the run index knows it (a long session is not read whole
        // to find one run), else from the session's start.
        let from = store
            .run_start(&tenant, &session_id, run_id)
            .await?
            .map_or(0, |seq| seq.saturating_sub(1));
        let events = store.read(&tenant, &session_id, from).await?;
        if events.iter().any(|e| e.run_id == run_id) {
            return Ok(RunRef {
                tenant_id: tenant,
                session_id,
                run_id: run_id.to_owned(),
            });
        }
        Err(LoomError::UnknownRun(run_id.to_owned()))
    }

    /// The events of one run, in journal order.
    pub async fn events(&self, run: &RunRef) -> Result<Vec<Event>, LoomError> {
        let mut events = self.inner.engine.read_run(run).await?;
        events.retain(|e| e.run_id == run.run_id);
        if events.is_empty() {
            return Err(LoomError::UnknownRun(run.run_id.clone()));
        }
        Ok(events)
    }

    /// The run's state, folded from its journal.
    pub async fn state(&self, run: &RunRef) -> Result<RunState, LoomError> {
        let events = self.events(run).await?;
        RunState::fold(&run.run_id, &events)
            .map_err(|e| LoomError::from(loom_engine::EngineError::Fold(e)))
    }

    /// The run's result, read from its session's journal (also for a run still going on):
    /// what every door returns ([`RunResult::from_events`]). A run waiting for its sub-runs
    /// lists their pending approvals. The journal is read from the run's start when the
    /// store's run index knows it (its sub-runs start after it), so a client polling a run
    /// (MCP's `run_status`, REST's `GET /runs/{id}`) does not read the runs before it.
    pub async fn result(&self, run: &RunRef) -> Result<RunResult, LoomError> {
        // Shared with the store: a result only reads the events.
        let mut events = self.inner.engine.read_run_shared(run).await?;
        // A compaction run just before the run (at its opening) is part of its result: read
        // from its start when the events read begin with the run.
        if let Some(first) = events
            .first()
            .filter(|e| e.run_id == run.run_id)
            .map(|e| e.seq)
        {
            let store = self.inner.engine.store();
            let previous = store
                .last_of_type(&run.tenant_id, &run.session_id, "run.started", first)
                .await?;
            if let Some(previous) = previous.filter(|e| {
                matches!(&e.payload, loom_core::Payload::RunStarted(p) if p.kind == "compaction")
            }) {
                let mut before = store
                    .read_shared(&run.tenant_id, &run.session_id, previous.seq - 1)
                    .await?;
                before.retain(|e| e.seq < first);
                before.append(&mut events);
                events = before;
            }
        }
        RunResult::from_events(&run.run_id, &events)
            .map_err(|e| LoomError::from(loom_engine::EngineError::Fold(e)))
    }

    /// The sessions of a tenant, most recent first.
    pub async fn sessions(&self, tenant: Option<&str>) -> Result<Vec<SessionListed>, LoomError> {
        let sessions = self
            .inner
            .engine
            .store()
            .sessions(tenant.unwrap_or(DEFAULT_TENANT))
            .await?;
        Ok(sessions.into_iter().map(SessionListed::from).collect())
    }

    /// The runs of a session, in the order they started, folded from its journal.
    pub async fn session_runs(
        &self,
        session: &str,
        tenant: Option<&str>,
    ) -> Result<Vec<RunState>, LoomError> {
        let tenant = tenant.unwrap_or(DEFAULT_TENANT);
        let events = self.inner.engine.store().read(tenant, session, 0).await?;
        if events.is_empty() {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        crate::sessions::folded(&events)
    }

    /// A session's journal as JSONL, one event per line, exactly as stored.
    pub async fn export_session(
        &self,
        session: &str,
        tenant: Option<&str>,
    ) -> Result<String, LoomError> {
        let events = self
            .inner
            .engine
            .store()
            .read(tenant.unwrap_or(DEFAULT_TENANT), session, 0)
            .await?;
        if events.is_empty() {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let mut out = String::new();
        for event in events {
            out.push_str(&event.to_json());
            out.push('\n');
        }
        Ok(out)
    }

    /// Erases a session (GDPR): its journal, its files and its idempotency keys, and says how
    /// many of each went. [`LoomError::UnknownSession`] when its journal held nothing.
    pub async fn delete_session(
        &self,
        session: &str,
        tenant: Option<&str>,
    ) -> Result<crate::SessionDeletion, LoomError> {
        let tenant = tenant.unwrap_or(DEFAULT_TENANT);
        if !loom_core::ids::is_safe_id(session) {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let events_deleted = self.inner.engine.store().delete(tenant, session).await?;
        if events_deleted == 0 {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let mut deletion = crate::SessionDeletion {
            session_id: session.to_owned(),
            events_deleted,
            files_deleted: 0,
            idempotency_keys_deleted: 0,
        };
        if let Some(artifacts) = self.inner.engine.artifacts() {
            deletion.files_deleted = artifacts.delete_session(tenant, session).await?;
        }
        if let Some(keys) = self.inner.engine.idempotency() {
            deletion.idempotency_keys_deleted = keys.delete_session(tenant, session).await?;
        }
        Ok(deletion)
    }
}
