//! A session's state as callers read it ([`Loom::session_state`]): the values its runs wrote
//! (the callers' `run.started.state`, the accepted writes of successful tool results) over the
//! defaults its agent declares, folded from the session's journal
//! ([`loom_core::state::SessionState`]).

use loom_core::state::SessionState;
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
        let events = self.session_events(session, tenant).await?;
        let owner = events.iter().find_map(|e| e.agent.clone());
        let defaults: Vec<(String, Value)> = owner
            .and_then(|name| self.config().agent(&name))
            .map(|spec| {
                spec.state
                    .iter()
                    .filter_map(|(k, key)| key.default.clone().map(|v| (k.clone(), v)))
                    .collect()
            })
            .unwrap_or_default();
        Ok(SessionState::fold(&events, defaults).values())
    }
}
