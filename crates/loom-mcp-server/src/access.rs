//! Who calls the MCP server: its tenant, and the API key it came with (none on stdio).

use std::sync::Arc;

use loom_ia::config::{ApiKeySpec, Config, Scope};

/// What one MCP request may do. Over stdio (`loom mcp`) everything is allowed in one tenant;
/// over HTTP the caller's API key decides the tenant, the scopes and the agents, exactly as on
/// the REST API (`loom-http` checks the key and puts the `Access` in the request's extensions).
#[derive(Debug, Clone)]
pub struct Access {
    tenant: String,
    key: Option<Arc<ApiKeySpec>>,
}

impl Access {
    /// Everything allowed in `tenant` (`loom mcp` on stdio: no key).
    pub fn local(tenant: impl Into<String>) -> Access {
        Access {
            tenant: tenant.into(),
            key: None,
        }
    }

    /// What `key` allows: its tenant, its scopes, its agents.
    pub fn key(key: Arc<ApiKeySpec>) -> Access {
        Access {
            tenant: key.tenant.clone(),
            key: Some(key),
        }
    }

    /// The tenant every run of the request is opened and looked up in.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Whether the caller has `scope` (`admin` has them all; no key: every scope).
    pub fn allows(&self, scope: Scope) -> bool {
        self.key.as_ref().is_none_or(|key| key.allows(scope))
    }

    /// Whether the caller may do anything over MCP: call agents (`run`) or read (`read`). A key
    /// with neither (only `approve`, say) is refused at the door: approvals never go through
    /// MCP.
    pub fn usable_over_mcp(&self) -> bool {
        self.allows(Scope::Run) || self.allows(Scope::Read)
    }

    /// Whether the caller may read content (messages, answers, arguments, files).
    pub(crate) fn reads_content(&self) -> bool {
        self.allows(Scope::ReadContent)
    }

    /// Whether the key limits the agents it may use.
    pub(crate) fn agent_limited(&self) -> bool {
        self.key.as_ref().is_some_and(|key| !key.agents.is_empty())
    }

    /// The agents the key is limited to (`None`: any), as the REST API filters its lists.
    pub(crate) fn agent_limit(&self) -> Option<Vec<String>> {
        self.key
            .as_ref()
            .filter(|key| !key.agents.is_empty())
            .map(|key| key.agents.clone())
    }

    /// The refusal of an agent the key may not use, naming the key and the agent.
    pub(crate) fn require_agent(&self, agent: &str) -> Result<(), String> {
        match &self.key {
            Some(key) if !key.allows_agent(agent) => Err(format!(
                "key '{}' is not allowed on the agent '{agent}'",
                key.id
            )),
            _ => Ok(()),
        }
    }

    /// Whether the caller may use `agent` (its key's `agents`, its tenant's `agents`).
    pub(crate) fn allows_agent(&self, config: &Config, agent: &str) -> bool {
        self.key.as_ref().is_none_or(|key| key.allows_agent(agent))
            && config
                .tenant(&self.tenant)
                .is_none_or(|tenant| tenant.allows_agent(agent))
    }

    /// The refusal of a missing scope, naming the key and the scope.
    pub(crate) fn require(&self, scope: Scope) -> Result<(), String> {
        match &self.key {
            Some(key) if !key.allows(scope) => {
                Err(format!("key '{}' lacks the scope '{scope}'", key.id))
            }
            _ => Ok(()),
        }
    }

    /// Who decides or cancels when the caller does not say: `mcp:<client name>`.
    pub(crate) fn by(client: Option<&str>) -> String {
        format!(
            "mcp:{}",
            client.filter(|c| !c.trim().is_empty()).unwrap_or("client")
        )
    }
}
