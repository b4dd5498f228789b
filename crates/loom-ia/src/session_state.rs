//! A session's state as callers read it ([`Loom::session_state`]): the values its runs wrote
//! (the callers' `run.started.state`, the accepted writes of successful tool results) over the
//! defaults its agent declares, folded from the session's journal
//! ([`loom_core::state::SessionState`]), from the session's last snapshot on.

use loom_core::{Payload, event::SessionSnapshot};
use serde_json::{Map, Value};

use crate::{Loom, LoomError};

impl Loom {
    /// The state of `session` (sorted by key): `{}` when its agent declares no state. The
    /// defaults are those the session's agent (the one that opened it) declares in the
    /// configuration as it is now. [`LoomError::UnknownSession`] when the tenant has no such
    /// session.
    pub async fn session_state(
        &self,
        session: &str,
        tenant: Option<&str>,
    ) -> Result<Map<String, Value>, LoomError> {
        let tenant = tenant.unwrap_or(crate::DEFAULT_TENANT);
        if !loom_core::ids::is_safe_id(session) {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        // From the session's last snapshot, which carries the state up to it.
        let events = self.read_latest(tenant, session).await?;
        if events.is_empty() {
            return Err(LoomError::UnknownSession(session.to_owned()));
        }
        let owner = events.iter().find_map(|e| match &e.payload {
            Payload::RunStarted(started)
                if started.parent_run_id.is_none() && started.kind == "normal" =>
            {
                e.agent.clone()
            }
            Payload::SessionSnapshot(_) => e.agent.clone(),
            _ => None,
        });
        let defaults: Vec<(String, Value)> = owner
            .and_then(|name| self.config().agent(&name))
            .map(|spec| {
                spec.state
                    .iter()
                    .filter_map(|(k, key)| key.default.clone().map(|v| (k.clone(), v)))
                    .collect()
            })
            .unwrap_or_default();
        let mut state = SessionSnapshot::base_of(&events)
            .and_then(|s| s.state.clone())
            .unwrap_or_default()
            .with_defaults(defaults);
        for event in &events {
            state.apply(event);
        }
        Ok(state.values())
    }
}
