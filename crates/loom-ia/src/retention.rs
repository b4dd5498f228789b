//! Retention (`storage.retention.events_days`): sessions whose last write is older than the
//! bound are erased whole — journal, files, idempotency keys — as [`Loom::delete_session`]
//! erases one, when [`Loom::retention`] is applied (`loom retention --yes`); without `apply` it
//! lists what would go. Nothing is erased on its own: the platform schedules the sweep.
//!
//! The bound is decided on a session's last write ([`SessionSummary::updated_at`], the time of
//! its last event, from the clear envelope), never on its content: a sealed session whose key is
//! gone is erased like any other, and so is a session where a run waits for an approval.
//!
//! [`SessionSummary::updated_at`]: loom_core::ports::SessionSummary::updated_at

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::{DEFAULT_TENANT, Loom, LoomError, SessionDeletion};

/// What a retention sweep found, or erased.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetentionReport {
    /// Whether the sessions listed were erased (`false`: a dry run, nothing was touched).
    pub applied: bool,
    /// The instant the bounds were computed from.
    #[serde(with = "crate::query::rfc3339")]
    pub now: DateTime<Utc>,
    /// Each tenant swept, in order.
    pub tenants: Vec<RetentionTenant>,
}

impl RetentionReport {
    /// The sessions that go (or went), over every tenant.
    pub fn sessions(&self) -> usize {
        self.tenants.iter().map(|t| t.sessions.len()).sum()
    }
}

/// One tenant's part of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetentionTenant {
    /// The tenant.
    pub tenant_id: String,
    /// Its bound in days (`None`: it keeps everything, and nothing of it is listed).
    pub events_days: Option<u32>,
    /// Sessions last written before this instant go.
    #[serde(with = "opt_rfc3339")]
    pub cutoff: Option<DateTime<Utc>>,
    /// The sessions that go (or went), oldest write first.
    pub sessions: Vec<RetentionSession>,
    /// How many of its sessions stay.
    pub kept: usize,
}

/// A session past its tenant's bound.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetentionSession {
    /// The session.
    pub session_id: String,
    /// Its last write.
    #[serde(with = "crate::query::rfc3339")]
    pub updated_at: DateTime<Utc>,
    /// How many events its journal holds (its last seq).
    pub events: u64,
    /// What was erased, once applied (`None` in a dry run, or when another sweep erased it
    /// first).
    pub deleted: Option<SessionDeletion>,
}

mod opt_rfc3339 {
    use chrono::{DateTime, Utc};
    use serde::Serializer;

    pub(super) fn serialize<S: Serializer>(
        ts: &Option<DateTime<Utc>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match ts {
            Some(ts) => crate::query::rfc3339::serialize(ts, s),
            None => s.serialize_none(),
        }
    }
}

impl Loom {
    /// The retention sweep now: for `tenant`, or every tenant of the configuration (`default`
    /// without `tenants`), the sessions whose last write is older than the tenant's
    /// `events_days`; erased when `apply`, listed otherwise (see the module).
    pub async fn retention(
        &self,
        tenant: Option<&str>,
        apply: bool,
    ) -> Result<RetentionReport, LoomError> {
        self.retention_at(tenant, apply, Utc::now()).await
    }

    /// [`Loom::retention`] as if it were `now`: what a sweep at another instant would erase.
    pub async fn retention_at(
        &self,
        tenant: Option<&str>,
        apply: bool,
        now: DateTime<Utc>,
    ) -> Result<RetentionReport, LoomError> {
        let config = self.config();
        let tenants: Vec<String> = match tenant {
            Some(tenant) => {
                config
                    .check_tenant(tenant)
                    .map_err(|e| LoomError::Refused(e.to_string()))?;
                vec![tenant.to_owned()]
            }
            None if config.raw().tenants.is_empty() => vec![DEFAULT_TENANT.to_owned()],
            None => config.raw().tenants.iter().map(|t| t.id.clone()).collect(),
        };
        let mut report = RetentionReport {
            applied: apply,
            now,
            tenants: Vec::new(),
        };
        for tenant in tenants {
            report.tenants.push(self.sweep(tenant, apply, now).await?);
        }
        Ok(report)
    }

    /// One tenant's sweep.
    async fn sweep(
        &self,
        tenant: String,
        apply: bool,
        now: DateTime<Utc>,
    ) -> Result<RetentionTenant, LoomError> {
        let events_days = self.retention_days(&tenant);
        let cutoff = events_days.map(|days| now - chrono::Duration::days(i64::from(days)));
        let mut swept = RetentionTenant {
            tenant_id: tenant,
            events_days,
            cutoff,
            sessions: Vec::new(),
            kept: 0,
        };
        let summaries = self.store().sessions(&swept.tenant_id).await?;
        for summary in summaries {
            let old = match (cutoff, summary.updated_at) {
                (Some(cutoff), Some(at)) => at < cutoff,
                _ => false,
            };
            match summary.updated_at {
                Some(updated_at) if old => swept.sessions.push(RetentionSession {
                    session_id: summary.session_id,
                    updated_at,
                    events: summary.last_seq,
                    deleted: None,
                }),
                _ => swept.kept += 1,
            }
        }
        swept
            .sessions
            .sort_by(|a, b| (a.updated_at, &a.session_id).cmp(&(b.updated_at, &b.session_id)));
        if apply {
            for session in &mut swept.sessions {
                session.deleted = match self
                    .delete_session(&session.session_id, Some(&swept.tenant_id))
                    .await
                {
                    Ok(deletion) => Some(deletion),
                    Err(LoomError::UnknownSession(_)) => None,
                    Err(other) => return Err(other),
                };
                tracing::info!(
                    tenant = %swept.tenant_id,
                    session = %session.session_id,
                    updated_at = %session.updated_at,
                    "session erased by retention"
                );
            }
        }
        Ok(swept)
    }

    /// The retention bound of `tenant`, in days: its own `tenants[].retention.events_days`
    /// when it declares one, else `storage.retention.events_days`.
    fn retention_days(&self, tenant: &str) -> Option<u32> {
        let config = self.config();
        config
            .tenant(tenant)
            .and_then(|t| t.retention.as_ref())
            .map_or(config.raw().storage.retention.events_days, |r| {
                r.events_days
            })
    }
}
