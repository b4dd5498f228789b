//! Readiness: whether the services this instance needs answer (the journal, the job queue; the
//! bus and shared limits when declared), for a load balancer or an orchestrator
//! (`GET /readyz` of `loom serve`).

use serde::Serialize;

use super::{DEFAULT_TENANT, Loom};

/// What [`Loom::readiness`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Readiness {
    /// Whether every check passed.
    pub ready: bool,
    /// Each service checked, in order.
    pub checks: Vec<ReadinessCheck>,
}

/// One service checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct ReadinessCheck {
    /// `journal`, `queue`, `bus` or `limits`.
    pub name: String,
    /// Whether it answered.
    pub ok: bool,
}

impl Loom {
    /// Asks each service this instance needs whether it answers: the journal (a read of one
    /// session's last seq), the job queue when `storage.queue` declares a broker, and the event
    /// bus when it reaches other processes (`storage.bus`: redis or postgres), and the shared
    /// limits (`storage.limits: redis`). A failure
    /// is logged with its cause; the answer names only the service.
    pub async fn readiness(&self) -> Readiness {
        let mut checks = Vec::new();
        let journal = self
            .store()
            .last_seq(DEFAULT_TENANT, "loom-readiness")
            .await;
        if let Err(error) = &journal {
            tracing::warn!(%error, "readiness: the journal does not answer");
        }
        checks.push(check("journal", journal.is_ok()));
        if crate::queue::declared(self.config()) || self.inner.queue.get().is_some() {
            let queue = match self.job_queue().await {
                Ok(Some(queue)) => queue.ping().await.map_err(crate::LoomError::from),
                Ok(None) => Ok(()),
                Err(error) => Err(error),
            };
            if let Err(error) = &queue {
                tracing::warn!(%error, "readiness: the job queue does not answer");
            }
            checks.push(check("queue", queue.is_ok()));
        }
        if self.inner.bus_shared {
            let bus = self.inner.bus.ping().await;
            if let Err(error) = &bus {
                tracing::warn!(%error, "readiness: the event bus does not answer");
            }
            checks.push(check("bus", bus.is_ok()));
        }
        if self.config().raw().storage.limits.backend != loom_config::LimitsBackend::Memory {
            let limits = self.inner.counters.ping().await;
            if let Err(error) = &limits {
                tracing::warn!(%error, "readiness: the shared limits do not answer");
            }
            checks.push(check("limits", limits.is_ok()));
        }
        Readiness {
            ready: checks.iter().all(|c| c.ok),
            checks,
        }
    }
}

fn check(name: &str, ok: bool) -> ReadinessCheck {
    ReadinessCheck {
        name: name.to_owned(),
        ok,
    }
}
