//! An agent's sandbox (`sandbox:`) and skills (`skills:`): the backend it names, and the tools
//! `sandbox__*` and `skills__*` bound over it.

use std::sync::Arc;

use loom_config::{SandboxBackend, SandboxScope, SandboxSpec};
use loom_core::sandbox::{Limits, Sandbox};
use loom_engine::BoundTool;
use loom_sandbox::{Scope, Settings, SkillDoc};

use super::{Resolver, Stage};
use crate::LoomError;

impl Resolver<'_> {
    /// The tools of the agent's sandbox and skills (none when it declares neither). When the
    /// configuration is opened nothing is built: the backend is set up when the agent is
    /// resolved to run.
    pub(super) fn sandbox_tools(
        &self,
        spec: &loom_config::AgentSpec,
    ) -> Result<Vec<BoundTool>, LoomError> {
        if self.stage == Stage::Open || (spec.sandbox.is_none() && spec.skills.is_empty()) {
            return Ok(Vec::new());
        }
        let at = |key: &str, message: String| {
            LoomError::from(self.config.error_at_agent(&spec.name, key, message))
        };
        let settings = match &spec.sandbox {
            Some(sandbox) => Some(Settings {
                sandbox: self.backend(spec, sandbox).map_err(|m| at("sandbox", m))?,
                scope: match sandbox.scope {
                    SandboxScope::Run => Scope::Run,
                    SandboxScope::Session => Scope::Session,
                },
                limits: limits(sandbox),
                network: sandbox.network,
            }),
            None => None,
        };
        let mut tools = Vec::new();
        if let Some(settings) = &settings {
            tools.extend(loom_sandbox::sandbox_tools(settings.clone()));
        }
        let skills = self.config.skills(&spec.name);
        if !skills.is_empty() {
            let docs = skills
                .iter()
                .map(|skill| SkillDoc {
                    name: skill.name.clone(),
                    description: skill.description.clone(),
                    body: skill.body.clone(),
                    files: skill.files.clone(),
                })
                .collect();
            tools.extend(loom_sandbox::skill_tools(docs, settings));
        }
        tools
            .into_iter()
            .map(|tool| {
                BoundTool::declared(Arc::new(tool)).map_err(|e| at("sandbox", e.to_string()))
            })
            .collect()
    }

    /// The backend of the agent's sandbox.
    fn backend(
        &self,
        spec: &loom_config::AgentSpec,
        sandbox: &SandboxSpec,
    ) -> Result<Arc<dyn Sandbox>, String> {
        match sandbox.backend {
            SandboxBackend::Local => {
                let root = self
                    .config
                    .sandbox_root(&spec.name)
                    .ok_or_else(|| "the agent has no sandbox".to_owned())?;
                loom_sandbox::LocalSandbox::new(root)
                    .map(|local| Arc::new(local) as Arc<dyn Sandbox>)
                    .map_err(|e| e.to_string())
            }
            SandboxBackend::Remote => remote(sandbox),
        }
    }
}

/// The remote backend of `sandbox` (`url`, bearer token from `token_env`).
#[cfg(feature = "remote-sandbox")]
pub(crate) fn remote(sandbox: &SandboxSpec) -> Result<Arc<dyn Sandbox>, String> {
    let (Some(url), Some(token_env)) = (&sandbox.url, &sandbox.token_env) else {
        return Err("backend: remote needs url and token_env".to_owned());
    };
    let token = std::env::var(token_env).map_err(|_| {
        format!("the environment variable {token_env} (sandbox.token_env) is not set")
    })?;
    loom_sandbox::remote::RemoteSandbox::new(url, token)
        .map(|remote| Arc::new(remote) as Arc<dyn Sandbox>)
        .map_err(|e| e.to_string())
}

/// The remote backend is refused by a build without it.
#[cfg(not(feature = "remote-sandbox"))]
pub(crate) fn remote(_sandbox: &SandboxSpec) -> Result<Arc<dyn Sandbox>, String> {
    Err(
        "backend: remote needs the Cargo feature 'remote-sandbox' of loom-ia, which this build \
         does not have"
            .to_owned(),
    )
}

/// The limits of `sandbox`, each absent one at its default.
pub(crate) fn limits(sandbox: &SandboxSpec) -> Limits {
    let given = sandbox.limits;
    let default = Limits::default();
    Limits {
        wall_ms: given.wall_ms.unwrap_or(default.wall_ms),
        cpu_ms: given.cpu_ms.unwrap_or(default.cpu_ms),
        memory_mb: given.memory_mb.unwrap_or(default.memory_mb),
        output_bytes: given.output_bytes.unwrap_or(default.output_bytes),
        processes: given.processes.unwrap_or(default.processes),
        file_mb: given.file_mb.unwrap_or(default.file_mb),
    }
}
