//! The file model of a tenant (`tenants[]`): its id, what it may run and the closed list of
//! what it overrides — its secrets, its prompt variables, its model mapping, its tools' approvals
//! and denials, its capture, its journal and its retention.
//!
//! Everything else of the configuration is common to every tenant: the same agents, prompts and
//! tools. Like the rest of the file model these types describe the shape of the file only; the
//! rules between fields (declared models, known tools, secrets something names…) are checked
//! when a [`crate::Config`] is built (`config/tenants.rs`).

use std::{collections::BTreeMap, fmt, path::PathBuf};

use loom_core::tool::Approval;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::guards::Budgets;
use crate::model::{ArtifactsStorage, EventsStorage};

/// A tenant (`tenants[]`): an id, the agents it may run, its budgets and quotas, and what it
/// overrides of the common configuration.
///
/// Without a `tenants` list only the tenant `default` exists; with one, the list is closed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    /// Unique id (`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`; it names journal files).
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"))]
    pub id: String,
    /// The agents it may run (declared agent names); empty: all of them.
    #[serde(default)]
    pub agents: Vec<String>,
    /// Tools its runs are never offered, by the name the model sees (`lookup`,
    /// `crm__delete_contact`, a sub-agent's or a role's tool name); a model asking for one gets
    /// the unknown-tool error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools_deny: Vec<String>,
    /// Model mapping (`{from: to}`, both declared model ids): wherever its runs would use
    /// `from` (an orchestrator, a fallback, a role, a judge), they use `to`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, String>,
    /// Approval of a tool for its runs (`{tool: never|always|policy}`, by the name the model
    /// sees), over the agent's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub approvals: BTreeMap<String, Approval>,
    /// Its own credentials: a secret name the configuration uses (a model's `api_key_env`, an
    /// MCP server's `headers_env` or `env_from` value) read, for its runs, from another
    /// environment variable or (a Loom extension) from a file.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, SecretSource>,
    /// Values of the variables its system prompts use (`{{ var }}`, beside `agent` and
    /// `tenant`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variables: BTreeMap<String, Value>,
    /// Budgets merged over the root `budgets` for this tenant.
    #[serde(default)]
    pub budgets: Option<Budgets>,
    /// How fast the tenant may open runs.
    #[serde(default)]
    pub quotas: Option<Quotas>,
    /// Its own journal (and artifacts); encryption and idempotency stay the deployment's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<TenantStorage>,
    /// Its own retention, over `storage.retention`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<crate::at_rest::RetentionStorage>,
    /// What of its runs is captured, over `telemetry.capture`.
    #[serde(default, skip_serializing_if = "TenantTelemetry::is_empty")]
    pub telemetry: TenantTelemetry,
}

/// How fast a tenant may open runs (`tenants[].quotas`); `null`: no limit.
///
/// Counted per Loom instance (a server, a worker) over a sliding minute, in memory: a run
/// refused by a quota writes nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Quotas {
    /// Runs opened per sliding minute (at least 1).
    #[schemars(range(min = 1))]
    pub runs_per_minute: Option<u32>,
}

impl TenantSpec {
    /// A tenant allowed every agent, without budgets or overrides of its own.
    pub fn new(id: impl Into<String>) -> TenantSpec {
        TenantSpec {
            id: id.into(),
            agents: Vec::new(),
            tools_deny: Vec::new(),
            models: BTreeMap::new(),
            approvals: BTreeMap::new(),
            secrets: BTreeMap::new(),
            variables: BTreeMap::new(),
            budgets: None,
            quotas: None,
            storage: None,
            retention: None,
            telemetry: TenantTelemetry::default(),
        }
    }

    /// Whether the tenant may run `agent` (an empty `agents` list allows all).
    pub fn allows_agent(&self, agent: &str) -> bool {
        self.agents.is_empty() || self.agents.iter().any(|a| a == agent)
    }

    /// The model its runs use where the configuration says `model` (its `models` mapping).
    pub fn model<'a>(&'a self, model: &'a str) -> &'a str {
        self.models.get(model).map_or(model, String::as_str)
    }

    /// Whether its runs are never offered the tool the model sees as `name` (`tools_deny`).
    pub fn denies(&self, name: &str) -> bool {
        self.tools_deny.iter().any(|t| t == name)
    }
}

/// Where a tenant's secret is read (`tenants[].secrets.<name>`): the name of an environment
/// variable, or `{file: path}` (a Loom extension, for secrets mounted as files: read at use,
/// trimmed, a regular file of at most 64 KiB, the path relative to the config file).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(
    untagged,
    expecting = "the name of an environment variable, or {file: path} for a secret kept in a file"
)]
pub enum SecretSource {
    /// An environment variable (the process environment, then the env file).
    Env(String),
    /// A file.
    File {
        /// Path of the file, relative to the config file.
        file: PathBuf,
    },
}

impl fmt::Debug for SecretSource {
    /// Where, never what: a secret source shows the variable's name or the file's path.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::Env(variable) => write!(f, "env {variable}"),
            SecretSource::File { file } => write!(f, "file {}", file.display()),
        }
    }
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A tenant's own storage (`tenants[].storage`): its journal (required) and its artifacts. Its
/// encryption and idempotency store are the deployment's (`storage.encryption`,
/// `storage.idempotency`) and cannot be overridden.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantStorage {
    /// Its journal.
    pub events: EventsStorage,
    /// Its files; without `backend`, beside its journal as for the root journal.
    #[serde(default)]
    pub artifacts: ArtifactsStorage,
}

/// What a tenant overrides of the telemetry: its capture, nothing else (redaction and
/// exporters are the deployment's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TenantTelemetry {
    /// Its capture; each key left out keeps the root's.
    pub capture: CaptureOverride,
}

impl TenantTelemetry {
    /// Whether it overrides nothing.
    pub fn is_empty(&self) -> bool {
        self.capture == CaptureOverride::default()
    }
}

/// A tenant's capture (`tenants[].telemetry.capture`), over `telemetry.capture` key by key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureOverride {
    /// Journal the raw HTTP exchanges of its model calls (`model.exchanged`).
    pub raw_exchanges: Option<bool>,
    /// Bytes kept of each captured body.
    #[schemars(range(min = 1))]
    pub raw_max_bytes: Option<u64>,
}

impl CaptureOverride {
    /// `root` with this override applied.
    pub fn over(&self, root: &crate::CaptureConfig) -> crate::CaptureConfig {
        crate::CaptureConfig {
            raw_exchanges: self.raw_exchanges.unwrap_or(root.raw_exchanges),
            raw_max_bytes: self.raw_max_bytes.unwrap_or(root.raw_max_bytes),
            exports: root.exports,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_source_is_a_variable_or_a_file_and_shows_no_value() {
        let env: SecretSource = serde_json::from_value(serde_json::json!("MARTIN_CRM")).unwrap();
        assert_eq!(env, SecretSource::Env("MARTIN_CRM".into()));
        let file: SecretSource =
            serde_json::from_value(serde_json::json!({"file": "secrets/crm"})).unwrap();
        assert_eq!(format!("{file:?}"), "file secrets/crm");
        assert!(serde_json::from_value::<SecretSource>(serde_json::json!({"env": "X"})).is_err());
    }

    #[test]
    fn capture_overrides_key_by_key() {
        let root = crate::CaptureConfig::default();
        let over = CaptureOverride {
            raw_exchanges: Some(true),
            raw_max_bytes: None,
        };
        let merged = over.over(&root);
        assert!(merged.raw_exchanges);
        assert_eq!(merged.raw_max_bytes, root.raw_max_bytes);
    }
}
