//! Webhooks (`triggers`): a payload from a system that does not know Loom's API opens a
//! background run of the trigger's agent, with a message (and optionally a session) rendered
//! from the payload.
//!
//! A delivery id (from the trigger's `delivery_header` over HTTP) becomes the run id, so a
//! sender retrying the same delivery finds the run its first attempt opened
//! ([`Triggered::repeated`]) instead of opening another; a delivery id that already names a run
//! of another session, or of something else than this trigger, is refused.

use std::collections::BTreeMap;

use loom_config::{Config, TriggerSpec};
use loom_core::{Payload, RunStatus, ids::is_safe_id};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{DEFAULT_TENANT, Loom, LoomError, RunOptions, RunRef};

/// The signing secrets of the triggers that declare `secret_env`, by trigger name.
#[derive(Default)]
pub(crate) struct Secrets(BTreeMap<String, Vec<u8>>);

impl Secrets {
    /// The secret of the trigger `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&[u8]> {
        self.0.get(name).map(Vec::as_slice)
    }
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: a secret is never printed.
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// Reads the signing secret of every trigger with a `secret_env` from the environment; an
/// absent or empty variable is a configuration error naming `triggers[i].secret_env`.
pub(crate) fn secrets(config: &Config) -> Result<Secrets, LoomError> {
    let mut secrets = BTreeMap::new();
    for (index, trigger) in config.triggers().iter().enumerate() {
        let Some(variable) = &trigger.secret_env else {
            continue;
        };
        match crate::env::var(config, variable) {
            Some(value) if !value.is_empty() => {
                secrets.insert(trigger.name.clone(), value.into_bytes());
            }
            _ => {
                return Err(config
                    .error_at_root(
                        &format!("triggers[{index}].secret_env"),
                        format!(
                            "trigger '{}': the environment variable {variable} is absent or \
                             empty",
                            trigger.name
                        ),
                    )
                    .into());
            }
        }
    }
    Ok(Secrets(secrets))
}

/// What a delivery to a trigger did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Triggered {
    /// The trigger's name.
    pub trigger: String,
    /// The run the delivery opened (or had opened, when repeated).
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// Its status when the delivery was answered (the run goes on in the background).
    pub status: RunStatus,
    /// Whether the delivery had been received before: no run was opened, `run_id` is the run
    /// of its first reception.
    pub repeated: bool,
}

impl Loom {
    /// The trigger called `name`, or [`LoomError::UnknownTrigger`].
    pub fn trigger_spec(&self, name: &str) -> Result<&TriggerSpec, LoomError> {
        let config = self.config();
        config
            .trigger(name)
            .ok_or_else(|| LoomError::UnknownTrigger {
                name: name.to_owned(),
                known: config.triggers().iter().map(|t| t.name.clone()).collect(),
            })
    }

    /// Delivers `payload` to the trigger `name` for `tenant` (default `default`): renders the
    /// trigger's `message` and `session` templates over `{payload, trigger, delivery}` and
    /// opens a background run of its agent (like [`Loom::submit`], tenant budgets and quotas
    /// included), journaling the trigger's name in `run.started.trigger`.
    ///
    /// With a `delivery_id`, it becomes the run id: when that run already exists in the
    /// trigger's session and was opened by this trigger, it is returned with
    /// [`Triggered::repeated`] and nothing is written.
    ///
    /// Refused with [`LoomError::UnknownTrigger`] for an unknown trigger, and with
    /// [`LoomError::Invalid`] (nothing written) when a template cannot be rendered from the
    /// payload (templates are strict: a missing field is an error), renders an empty message
    /// or an unusable session id, or when the delivery id is unusable as a run id or already
    /// names a run of another session or not opened by this trigger.
    pub async fn trigger(
        &self,
        name: &str,
        payload: Value,
        delivery_id: Option<String>,
        tenant: Option<&str>,
    ) -> Result<Triggered, LoomError> {
        let config = self.config();
        let agent = self.trigger_spec(name)?.agent.clone();
        let tenant = tenant.unwrap_or(DEFAULT_TENANT).to_owned();
        let refused = |why: String| LoomError::Invalid(format!("trigger '{name}': {why}"));
        if let Some(delivery) = &delivery_id
            && !is_safe_id(delivery)
        {
            return Err(refused(format!(
                "delivery id '{delivery}' is not usable as a run id (expected \
                 [A-Za-z0-9][A-Za-z0-9._-]{{0,127}})"
            )));
        }
        let rendered = config
            .render_trigger(name, &payload, delivery_id.as_deref())
            .map_err(|error| refused(format!("{}: {}", error.key_path, error.message)))?;
        if rendered.message.trim().is_empty() {
            return Err(refused(
                "the message rendered from the payload is empty".into(),
            ));
        }
        if let Some(session) = &rendered.session
            && !is_safe_id(session)
        {
            return Err(refused(format!(
                "the session rendered from the payload, '{session}', is not usable (expected \
                 [A-Za-z0-9][A-Za-z0-9._-]{{0,127}})"
            )));
        }
        let session = rendered.session;
        if let Some(delivery) = &delivery_id
            && let Some(first) = self
                .delivered(name, delivery, session.as_deref(), &tenant)
                .await?
        {
            return Ok(first);
        }
        let options = RunOptions {
            session_id: session.clone(),
            run_id: delivery_id.clone(),
            tenant_id: Some(tenant.clone()),
            trigger: Some(name.to_owned()),
            ..RunOptions::default()
        };
        let run = match self.submit(&agent, rendered.message, options).await {
            Ok(run) => run,
            // The same delivery, received twice at once: the other reception opened the run.
            Err(error @ LoomError::Refused(_)) => match &delivery_id {
                Some(delivery) => {
                    match self
                        .delivered(name, delivery, session.as_deref(), &tenant)
                        .await?
                    {
                        Some(first) => return Ok(first),
                        None => return Err(error),
                    }
                }
                None => return Err(error),
            },
            Err(error) => return Err(error),
        };
        tracing::info!(trigger = name, run_id = %run.run_id, "delivery received: run opened");
        let status = self.result(&run).await?.status;
        Ok(Triggered {
            trigger: name.to_owned(),
            run_id: run.run_id,
            session_id: run.session_id,
            status,
            repeated: false,
        })
    }

    /// The run a previous reception of `delivery` opened, if any: it must be in the trigger's
    /// session (`session`, else the session named after the run) and opened by the trigger.
    async fn delivered(
        &self,
        name: &str,
        delivery: &str,
        session: Option<&str>,
        tenant: &str,
    ) -> Result<Option<Triggered>, LoomError> {
        let run: RunRef = match self.locate(delivery, None, Some(tenant)).await {
            Ok(run) => run,
            Err(LoomError::UnknownRun(_)) => return Ok(None),
            Err(error) => return Err(error),
        };
        let refused = |why: String| {
            LoomError::Invalid(format!("trigger '{name}': delivery '{delivery}' {why}"))
        };
        if run.session_id != session.unwrap_or(delivery) {
            return Err(refused(format!(
                "is already the run id of another session ({}): a delivery id names one run",
                run.session_id
            )));
        }
        let events = self.events(&run).await?;
        let opened_by = events.iter().find_map(|event| match &event.payload {
            Payload::RunStarted(started) if event.run_id == run.run_id => Some(&started.trigger),
            _ => None,
        });
        match opened_by {
            Some(Some(trigger)) if trigger == name => {}
            Some(Some(other)) => {
                return Err(refused(format!(
                    "is already the run id of a run opened by the trigger '{other}'"
                )));
            }
            _ => {
                return Err(refused(
                    "is already the run id of a run no trigger opened".into(),
                ));
            }
        }
        tracing::info!(
            trigger = name,
            run_id = %run.run_id,
            "delivery received again: its first run is answered"
        );
        let status = self.result(&run).await?.status;
        Ok(Some(Triggered {
            trigger: name.to_owned(),
            run_id: run.run_id,
            session_id: run.session_id,
            status,
            repeated: true,
        }))
    }
}
