//! Load-time rules of `triggers` (names, agents, templates, delivery headers), and rendering a
//! trigger's templates for one delivery.

use serde_json::Value;

use super::{Config, make_error};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::prompt;
use crate::trigger::{
    RenderedTrigger, TRIGGER_VARIABLES, TriggerSpec, is_env_name, is_header_name,
};
use crate::yaml::KeyPath;

/// Refuses duplicate or unusable names, unknown agents, templates that do not parse or use
/// other variables than `payload`, `trigger` and `delivery`, unusable header names, secret
/// variable names and signature tolerances.
pub(super) fn check_triggers(config: &Config) -> Result<(), ConfigError> {
    let doc = &config.docs[0];
    let triggers = &config.raw.triggers;
    for (t, trigger) in triggers.iter().enumerate() {
        let tp = KeyPath::root().key("triggers").index(t);
        let invalid =
            |key: &str, message: String| doc.error(&tp.key(key), ConfigErrorKind::Invalid, message);
        if !crate::trigger::is_trigger_name(&trigger.name) {
            return Err(invalid(
                "name",
                format!(
                    "invalid trigger name '{}' (expected ^[a-z0-9][a-z0-9_-]{{0,63}}$)",
                    trigger.name
                ),
            ));
        }
        if let Some(j) = triggers[..t].iter().position(|x| x.name == trigger.name) {
            return Err(invalid(
                "name",
                format!(
                    "duplicate trigger name '{}' (already declared at triggers[{j}])",
                    trigger.name
                ),
            ));
        }
        if config.agent(&trigger.agent).is_none() {
            let names: Vec<&str> = config.agents.iter().map(|a| a.name.as_str()).collect();
            let declared = if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            };
            return Err(doc.error(
                &tp.key("agent"),
                ConfigErrorKind::Reference,
                format!(
                    "unknown agent '{}' (declared agents: {declared})",
                    trigger.agent
                ),
            ));
        }
        if trigger.message.trim().is_empty() {
            return Err(invalid("message", "must not be empty".into()));
        }
        let templates = [
            ("message", Some(&trigger.message)),
            ("session", trigger.session.as_ref()),
        ];
        for (key, text) in templates {
            if let Some(text) = text
                && let Err(issue) = prompt::check_variables(text, &TRIGGER_VARIABLES)
            {
                return Err(doc.error(&tp.key(key), ConfigErrorKind::Template, issue.message));
            }
        }
        if let Some(header) = &trigger.delivery_header
            && !is_header_name(header)
        {
            return Err(invalid(
                "delivery_header",
                format!("'{header}' is not a usable HTTP header name"),
            ));
        }
        if let Some(variable) = &trigger.secret_env
            && !is_env_name(variable)
        {
            return Err(invalid(
                "secret_env",
                format!(
                    "'{variable}' is not an environment variable name (expected \
                     [A-Za-z_][A-Za-z0-9_]*)"
                ),
            ));
        }
        if trigger.tenant.is_some() && trigger.secret_env.is_none() {
            return Err(invalid(
                "tenant",
                "names the tenant of signed deliveries and needs secret_env; an unsigned \
                 delivery takes the tenant of the caller's API key"
                    .into(),
            ));
        }
        if let Some(tenant) = trigger.signed_tenant()
            && let Err(unknown) = config.check_tenant(tenant)
        {
            let (key, hint) = match trigger.tenant {
                Some(_) => ("tenant", ""),
                None => ("secret_env", " (signed deliveries run in it: set tenant)"),
            };
            return Err(doc.error(
                &tp.key(key),
                ConfigErrorKind::Reference,
                format!("{unknown}{hint}"),
            ));
        }
        if trigger.signature_tolerance == 0 {
            return Err(invalid(
                "signature_tolerance",
                "must be greater than 0".into(),
            ));
        }
    }
    Ok(())
}

impl Config {
    /// The declared triggers (`triggers`), in order.
    pub fn triggers(&self) -> &[TriggerSpec] {
        &self.raw.triggers
    }

    /// The trigger called `name`.
    pub fn trigger(&self, name: &str) -> Option<&TriggerSpec> {
        self.raw.triggers.iter().find(|t| t.name == name)
    }

    /// Renders the `message` and `session` templates of trigger `name` for one delivery.
    ///
    /// Refused with a [`ConfigErrorKind::Template`] error at `triggers[i].message` (or
    /// `.session`) when a template does not render, e.g. a field missing from the payload
    /// (templates are strict); [`ConfigErrorKind::Reference`] for an unknown trigger.
    pub fn render_trigger(
        &self,
        name: &str,
        payload: &Value,
        delivery: Option<&str>,
    ) -> Result<RenderedTrigger, ConfigError> {
        let Some(t) = self.raw.triggers.iter().position(|x| x.name == name) else {
            return Err(make_error(
                &self.docs[0].display,
                None,
                &KeyPath::root().key("triggers"),
                ConfigErrorKind::Reference,
                format!("unknown trigger '{name}'"),
            ));
        };
        let spec = &self.raw.triggers[t];
        let render = |key: &str, text: &str| {
            prompt::render_trigger(text, payload, name, delivery).map_err(|issue| {
                self.docs[0].error(
                    &KeyPath::root().key("triggers").index(t).key(key),
                    ConfigErrorKind::Template,
                    issue.message,
                )
            })
        };
        let message = render("message", &spec.message)?;
        let session = match &spec.session {
            Some(text) => Some(render("session", text)?.trim().to_owned()),
            None => None,
        };
        Ok(RenderedTrigger { message, session })
    }
}
