//! Whether a tenant may open a run: its period budgets ([`Loom::with_tenant_budget`]) and its
//! `quotas.runs_per_minute`, checked before anything is written; and what each tenant gets, as
//! `validate` shows it.

use std::time::Duration;

use super::{Loom, ValidatedTenant};
use crate::LoomError;
use crate::budget::{Period, TenantBudget};
use loom_core::{
    Event,
    counters::{Slot, Sum, Taken},
};
use loom_engine::{
    AgentRuntime, BeginRun, Observer, RunRef,
    budget::{RunSpent, Spent},
};

/// How long a budget sum seeded from the journal lives at most before it is counted again from
/// the journal (`storage.limits` `backend: redis`).
pub(crate) const SUM_REFRESH: Duration = Duration::from_secs(15 * 60);

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
        let slot = self.take_quota(&tenant).await?;
        self.compact_at_opening(&tenant, begin.session_id.as_deref())
            .await;
        match self.inner.engine.begin(runtime, begin, observer).await {
            Ok(run) => Ok(run),
            Err(error) => {
                if let Some(slot) = slot
                    && let Err(lost) = self.inner.counters.give_back(&slot).await
                {
                    tracing::warn!(tenant, %lost, "quota slot of a run not opened not given back");
                }
                Err(error.into())
            }
        }
    }

    /// Takes a slot of `tenant`'s `quotas.runs_per_minute` (`None`: the tenant has no quota),
    /// counted in `storage.limits` (this process, or every process sharing Redis), or refuses
    /// with [`LoomError::QuotaExceeded`]; [`LoomError::LimitsUnavailable`] when the shared
    /// counters cannot be reached (never let through uncounted).
    pub(super) async fn take_quota(&self, tenant: &str) -> Result<Option<Slot>, LoomError> {
        let Some(limit) = self
            .inner
            .config
            .tenant(tenant)
            .and_then(|t| t.quotas)
            .and_then(|q| q.runs_per_minute)
        else {
            return Ok(None);
        };
        let taken = self
            .inner
            .counters
            .take(&format!("quota:{tenant}"), limit, crate::quota::WINDOW)
            .await
            .map_err(|error| {
                tracing::error!(tenant, %error, "run refused: the tenant quota cannot be counted");
                LoomError::limits_unavailable(format!("the quota of tenant '{tenant}'"), &error)
            })?;
        match taken {
            Taken::Slot(slot) => Ok(Some(slot)),
            Taken::Full { retry_after } => {
                tracing::info!(tenant, limit, "run refused: tenant quota reached");
                Err(LoomError::QuotaExceeded {
                    tenant: tenant.to_owned(),
                    limit,
                    retry_after,
                })
            }
        }
    }

    /// Refuses a run of `tenant` when it reached one of its period ceilings. What it spent in
    /// each window is the window's sum in `storage.limits` when it holds one, else the journal's
    /// count (root runs by their start), which then seeds the sum ([`Loom::budget_spent`]).
    pub(super) async fn check_tenant_budget(&self, tenant: &str) -> Result<(), LoomError> {
        let Some(budget) = self.tenant_budget(tenant).filter(|b| !b.is_empty()) else {
            return Ok(());
        };
        let now = chrono::Utc::now();
        let spent = self.budget_spent(tenant, &budget, now).await?;
        let spent_in = |period: Period| {
            spent
                .iter()
                .find(|(p, _)| *p == period)
                .map(|(_, s)| *s)
                .unwrap_or_default()
        };
        match crate::budget::reached(&budget, now, spent_in) {
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

    /// What `tenant` spent in the window of each period `budget` limits, at `now`: the window's
    /// sum (`budget:<tenant>:<period>:<label>`) when the counters hold it, else the journal's
    /// count, seeded into the sum for [`SUM_REFRESH`] at most (then counted again from the
    /// journal, which bounds what a spending appended while it was seeded could miss).
    pub(crate) async fn budget_spent(
        &self,
        tenant: &str,
        budget: &TenantBudget,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<(Period, Spent)>, LoomError> {
        let unavailable = |error: &loom_core::counters::CounterError| {
            tracing::error!(tenant, %error, "run refused: the tenant budget cannot be counted");
            LoomError::limits_unavailable(format!("the budget of tenant '{tenant}'"), error)
        };
        let mut scanned: Option<Vec<RunSpent>> = None;
        let mut spent = Vec::new();
        for period in crate::budget::periods(budget) {
            let key = crate::counting::sum_key(tenant, period, now);
            let counters = &self.inner.counters;
            let sum = match counters.sum(&key).await.map_err(|e| unavailable(&e))? {
                Some(sum) => sum,
                None => {
                    if scanned.is_none() {
                        scanned = Some(self.scanned_runs(tenant, budget, now).await?);
                    }
                    let runs = scanned.as_deref().unwrap_or_default();
                    let counted = crate::budget::spent_in(runs, period, now);
                    let (_, end) = period.window(now);
                    let ttl = (end - now).to_std().unwrap_or_default().min(SUM_REFRESH);
                    let value = Sum {
                        cost_usd: counted.cost_usd,
                        tokens: counted.tokens,
                    };
                    counters
                        .seed(&key, value, ttl)
                        .await
                        .map_err(|e| unavailable(&e))?
                }
            };
            spent.push((
                period,
                Spent {
                    tokens: sum.tokens,
                    cost_usd: sum.cost_usd,
                    calls: 0,
                },
            ));
        }
        Ok(spent)
    }

    /// The root runs of `tenant` started since the first window `budget` limits, folded from
    /// its journals (a session that cannot be folded is left out with a warning).
    async fn scanned_runs(
        &self,
        tenant: &str,
        budget: &TenantBudget,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<RunSpent>, LoomError> {
        let from = crate::budget::scan_from(budget, now);
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
        Ok(runs)
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
