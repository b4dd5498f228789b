//! Whether a tenant may open a run: its period budgets ([`Loom::with_tenant_budget`]) and its
//! `quotas.runs_per_minute`, checked before anything is written; and what each tenant gets, as
//! `validate` shows it.

use super::{Loom, ValidatedTenant};
use crate::LoomError;
use crate::budget::TenantBudget;
use loom_core::Event;
use loom_engine::{AgentRuntime, BeginRun, Observer, RunRef};

impl Loom {
    /// What each declared tenant gets: its agents, denied tools, model mapping, approvals, the
    /// names of its secrets (and whether each has a value, never the value), its variables'
    /// names, its journal, retention and capture.
    pub(super) fn validated_tenants(&self) -> Vec<ValidatedTenant> {
        let config = &self.inner.config;
        config
            .raw()
            .tenants
            .iter()
            .map(|tenant| ValidatedTenant {
                id: tenant.id.clone(),
                agents: config
                    .agents()
                    .iter()
                    .filter(|a| tenant.allows_agent(&a.name))
                    .map(|a| a.name.clone())
                    .collect(),
                tools_deny: tenant.tools_deny.clone(),
                models: tenant
                    .models
                    .iter()
                    .map(|(from, to)| (from.clone(), to.clone()))
                    .collect(),
                approvals: tenant
                    .approvals
                    .iter()
                    .map(|(tool, approval)| (tool.clone(), approval_name(*approval).to_owned()))
                    .collect(),
                secrets: tenant
                    .secrets
                    .iter()
                    .map(|(name, source)| {
                        let set = matches!(
                            crate::secrets::secret(config, &tenant.id, name),
                            Ok(Some(_))
                        );
                        (name.clone(), source.to_string(), set)
                    })
                    .collect(),
                variables: tenant.variables.keys().cloned().collect(),
                journal: tenant.storage.as_ref().map(|storage| {
                    super::registry::describe_journal(
                        storage.events.backend,
                        config.tenant_events_path(&tenant.id),
                    )
                }),
                retention_days: tenant.retention.as_ref().and_then(|r| r.events_days),
                capture: (!tenant.telemetry.is_empty()).then(|| {
                    let capture = config.capture_for(&tenant.id);
                    (capture.raw_exchanges, capture.raw_max_bytes)
                }),
            })
            .collect()
    }

    /// Sets `tenant`'s period ceilings (replacing any it had): a run of the tenant is refused
    /// ([`LoomError::BudgetExhausted`], nothing written) once the root runs it started in the
    /// current UTC day or month spent as much. Applies to every clone of this instance.
    pub fn with_tenant_budget(self, tenant: impl Into<String>, budget: TenantBudget) -> Loom {
        if let Ok(mut budgets) = self.inner.tenant_budgets.write() {
            budgets.insert(tenant.into(), budget);
        }
        self
    }

    /// The period ceilings of `tenant`, if any.
    pub fn tenant_budget(&self, tenant: &str) -> Option<TenantBudget> {
        self.inner
            .tenant_budgets
            .read()
            .ok()
            .and_then(|b| b.get(tenant).copied())
    }

    /// Opens a run once the tenant's budgets and quota allow it (a refused run writes nothing,
    /// and a run that could not be opened gives its quota slot back).
    pub(super) async fn open_run(
        &self,
        runtime: &AgentRuntime,
        begin: BeginRun,
        observer: &dyn Observer,
    ) -> Result<RunRef, LoomError> {
        let tenant = begin.tenant_id.clone();
        self.check_tenant_budget(&tenant).await?;
        let slot = self.take_quota(&tenant)?;
        match self.inner.engine.begin(runtime, begin, observer).await {
            Ok(run) => Ok(run),
            Err(error) => {
                if let Some(at) = slot {
                    self.inner.quotas.give_back(&tenant, at);
                }
                Err(error.into())
            }
        }
    }

    /// Takes a slot of `tenant`'s `quotas.runs_per_minute` (`None`: the tenant has no quota),
    /// or refuses with [`LoomError::QuotaExceeded`].
    pub(super) fn take_quota(&self, tenant: &str) -> Result<Option<std::time::Instant>, LoomError> {
        let Some(limit) = self
            .inner
            .config
            .tenant(tenant)
            .and_then(|t| t.quotas)
            .and_then(|q| q.runs_per_minute)
        else {
            return Ok(None);
        };
        match self
            .inner
            .quotas
            .take(tenant, limit, std::time::Instant::now())
        {
            Ok(at) => Ok(Some(at)),
            Err(retry_after) => {
                tracing::info!(tenant, limit, "run refused: tenant quota reached");
                Err(LoomError::QuotaExceeded {
                    tenant: tenant.to_owned(),
                    limit,
                    retry_after,
                })
            }
        }
    }

    /// Refuses a run of `tenant` when it reached one of its period ceilings.
    pub(super) async fn check_tenant_budget(&self, tenant: &str) -> Result<(), LoomError> {
        let Some(budget) = self.tenant_budget(tenant).filter(|b| !b.is_empty()) else {
            return Ok(());
        };
        let now = chrono::Utc::now();
        let from = crate::budget::scan_from(&budget, now);
        let mut runs = Vec::new();
        for (session, events) in self.tenant_sessions(tenant, from).await? {
            match loom_engine::budget::root_runs_spent(&events) {
                Ok(spent) => runs.extend(spent.into_iter().filter(|r| r.started_at >= from)),
                // One broken session does not stop the tenant: its spending is not counted.
                Err(error) => {
                    tracing::warn!(tenant, session, %error, "session left out of the tenant budget: it cannot be folded");
                }
            }
        }
        match crate::budget::exhausted(&budget, &runs, now) {
            None => Ok(()),
            Some(hit) => {
                tracing::info!(tenant, period = %hit.period, "run refused: tenant budget reached");
                Err(LoomError::BudgetExhausted {
                    tenant: tenant.to_owned(),
                    period: hit.period,
                    spent: hit.spent,
                    limit: hit.limit,
                    retry_in: hit.retry_in,
                })
            }
        }
    }

    /// The journals of `tenant`'s sessions written to since `since` (a session last written
    /// before cannot hold a run started after), as `(session id, events)`; a corrupted journal
    /// is left out with a warning naming its file and line.
    pub(super) async fn tenant_sessions(
        &self,
        tenant: &str,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<(String, Vec<Event>)>, LoomError> {
        let store = self.inner.engine.store();
        let mut sessions = Vec::new();
        for session in store.sessions(tenant).await? {
            if session.updated_at.is_some_and(|at| at < since) {
                continue;
            }
            if let Some(events) =
                crate::journals::read_listed(store.as_ref(), tenant, &session.session_id).await?
            {
                sessions.push((session.session_id, events));
            }
        }
        Ok(sessions)
    }
}

/// How an approval is written in the configuration.
fn approval_name(approval: loom_core::tool::Approval) -> &'static str {
    match approval {
        loom_core::tool::Approval::Never => "never",
        loom_core::tool::Approval::Always => "always",
        loom_core::tool::Approval::Policy => "policy",
    }
}
