//! Reports for people: a run's trace and the usage reports of a run, a session or a tenant.

use super::{DEFAULT_TENANT, Loom};
use crate::LoomError;
use crate::budget::Period;
use crate::report;
use loom_core::Event;
use loom_engine::RunRef;

impl Loom {
    /// The run's trace: its spans (steps, model calls, tool calls, judges, approvals) and its
    /// sub-runs' under the tool calls that opened them, with content (what `loom inspect`
    /// shows; [`report::Trace::without_content`] removes the content).
    pub async fn trace(&self, run: &RunRef) -> Result<report::Trace, LoomError> {
        let events = self.session_events_of(run).await?;
        report::Trace::from_events(&run.run_id, &events)
            .map_err(|e| LoomError::from(loom_engine::EngineError::Fold(e)))
    }

    /// Tokens and cost of a run and its sub-runs: in total, run by run, by role, by agent and
    /// by model (what `loom report <run>` shows).
    pub async fn report(&self, run: &RunRef) -> Result<report::UsageReport, LoomError> {
        let events = self.session_events_of(run).await?;
        Ok(report::UsageReport::from_events(&run.run_id, &events))
    }

    /// The events of `run`'s session from its start (see [`loom_engine::Engine::read_run`]), refused ([`LoomError::UnknownRun`]) when the run has none.
    pub(crate) async fn session_events_of(&self, run: &RunRef) -> Result<Vec<Event>, LoomError> {
        let events = self.inner.engine.read_run(run).await?;
        if !events.iter().any(|e| e.run_id == run.run_id) {
            return Err(LoomError::UnknownRun(run.run_id.clone()));
        }
        Ok(events)
    }

    /// Tokens and cost of a session: every run, sub-runs included, and every call by role, by
    /// agent and by model (what `loom report --session` shows).
    pub async fn session_report(
        &self,
        session: &str,
        tenant: Option<&str>,
    ) -> Result<report::UsageReport, LoomError> {
        let tenant = tenant.unwrap_or(DEFAULT_TENANT);
        if !loom_core::ids::is_safe_id(session) {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let events = self.inner.engine.store().read(tenant, session, 0).await?;
        if events.is_empty() {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        Ok(report::UsageReport::for_session(tenant, session, &events))
    }

    /// Tokens and cost of a tenant over the UTC day or month holding `at`: the root runs it
    /// started then with their sub-runs, by run, role, agent and model (what
    /// `loom report --tenant` shows).
    pub async fn tenant_report(
        &self,
        tenant: &str,
        period: Period,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<report::UsageReport, LoomError> {
        let (from, _) = period.window(at);
        let sessions = self.tenant_sessions(tenant, from).await?;
        Ok(report::UsageReport::for_tenant(
            tenant, period, at, &sessions,
        ))
    }
}
