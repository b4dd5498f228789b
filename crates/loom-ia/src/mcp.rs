//! MCP servers declared in `mcp_servers`, built once per Loom instance.
//!
//! Secrets never sit in the configuration: `env_from` and `headers_env` name environment
//! variables, read here when the instance is built; a missing variable is a configuration
//! error naming the key.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use loom_config::{Config, McpScope, McpServerSpec, McpTransport};
use loom_core::{ports::ToolSource, tool::Approval};
use loom_mcp::{CircuitSettings, McpServer, McpServerOptions, Scope, ToolOverrides, Transport};

use crate::LoomError;

/// Builds every declared MCP server (connections open lazily, when a run needs them).
pub(crate) fn servers(config: &Config) -> Result<BTreeMap<String, Arc<dyn ToolSource>>, LoomError> {
    let mut servers: BTreeMap<String, Arc<dyn ToolSource>> = BTreeMap::new();
    for (index, spec) in config.raw().mcp_servers.iter().enumerate() {
        let options = options(config, index, spec)?;
        servers.insert(spec.name.clone(), Arc::new(McpServer::new(options)));
    }
    Ok(servers)
}

fn env_value(config: &Config, key: &str, variable: &str) -> Result<String, LoomError> {
    match crate::env::var(config, variable) {
        Some(value) if !value.is_empty() => Ok(value),
        _ => Err(config
            .error_at_root(
                key,
                format!("the environment variable {variable} is absent or empty"),
            )
            .into()),
    }
}

fn options(
    config: &Config,
    index: usize,
    spec: &McpServerSpec,
) -> Result<McpServerOptions, LoomError> {
    let at = |key: &str| format!("mcp_servers[{index}].{key}");
    let transport = match spec.transport {
        McpTransport::Stdio => {
            // The child inherits the process environment and, as in the reference (where the
            // env file is loaded into the process environment), the env file's variables the
            // process lacks; then the server's own `env` and `env_from`.
            let mut env: BTreeMap<String, String> = crate::env::file_only(config)
                .map(|(name, value)| (name.to_owned(), value.to_owned()))
                .collect();
            env.extend(spec.env.clone());
            for (name, variable) in &spec.env_from {
                env.insert(
                    name.clone(),
                    env_value(config, &at(&format!("env_from.{name}")), variable)?,
                );
            }
            Transport::Stdio {
                command: spec.command.clone().unwrap_or_default(),
                args: spec.args.clone(),
                env,
                cwd: Some(spec.cwd.as_ref().map_or_else(
                    || config.base_dir().to_path_buf(),
                    |cwd| config.base_dir().join(cwd),
                )),
            }
        }
        McpTransport::Http => {
            let mut headers = Vec::new();
            for (name, variable) in &spec.headers_env {
                headers.push((
                    name.clone(),
                    env_value(config, &at(&format!("headers_env.{name}")), variable)?,
                ));
            }
            Transport::Http {
                url: spec.url.clone().unwrap_or_default(),
                headers,
            }
        }
    };
    let mut overrides = BTreeMap::new();
    for (tool, o) in &spec.tools {
        if o.approval.is_some_and(|a| a != Approval::Never) {
            return Err(config
                .error_at_root(
                    &at(&format!("tools.{tool}.approval")),
                    "approval is declared per agent, not per server: set it in the agent's \
                     tools[].tools.<name>.approval",
                )
                .into());
        }
        if o.output.is_some() {
            return Err(config
                .error_at_root(
                    &at(&format!("tools.{tool}.output")),
                    "an output contract on an MCP tool is not supported in this version; give \
                     contracts to registered tools",
                )
                .into());
        }
        let timeout = match o.timeout {
            Some(secs) => Some(Duration::try_from_secs_f64(secs).map_err(|_| {
                LoomError::from(config.error_at_root(
                    &at(&format!("tools.{tool}.timeout")),
                    "not a usable duration",
                ))
            })?),
            None => None,
        };
        overrides.insert(
            tool.clone(),
            ToolOverrides {
                description: o.description.clone(),
                side_effects: o.side_effects,
                idempotent: o.idempotent,
                timeout,
                offload_over: o.offload_over,
            },
        );
    }
    let mut options = McpServerOptions::new(spec.name.clone(), transport);
    options.scope = match spec.scope {
        McpScope::Shared => Scope::Shared,
        McpScope::Tenant => Scope::Tenant,
        McpScope::Run => Scope::Run,
    };
    options.connect_timeout = Duration::try_from_secs_f64(spec.connect_timeout).map_err(|_| {
        LoomError::from(config.error_at_root(&at("connect_timeout"), "not a usable duration"))
    })?;
    options.circuit = match &spec.circuit_breaker {
        Some(breaker) => Some(CircuitSettings {
            failures: breaker.failures,
            cooldown: Duration::try_from_secs_f64(breaker.cooldown).map_err(|_| {
                LoomError::from(
                    config.error_at_root(&at("circuit_breaker.cooldown"), "not a usable duration"),
                )
            })?,
        }),
        None => None,
    };
    options.overrides = overrides;
    options
        .validate()
        .map_err(|e| LoomError::from(config.error_at_root(&at("name"), e.to_string())))?;
    Ok(options)
}
