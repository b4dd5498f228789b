//! MCP servers declared in `mcp_servers`, built once per Loom instance.
//!
//! Secrets never sit in the configuration: `env_from` and `headers_env` name secrets (environment
//! variables), read through [`crate::secrets`]. A server no tenant redirects a secret of is built
//! when the instance is built, and a missing variable is a configuration error naming the key.
//! A server some tenant redirects a secret of (its scope is then `tenant` or `run`, checked at
//! load) is [`PerTenant`]: one server per tenant, built with that tenant's values the first
//! time one of its runs opens it; a missing value then makes the source unavailable for that
//! tenant's runs only, with an error naming the secret, never its value.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use loom_config::{Config, McpScope, McpServerSpec, McpTransport};
use loom_core::{
    BoxFuture,
    ports::{SourceContext, SourceError, ToolSource},
    tool::Tool,
};
use loom_mcp::{CircuitSettings, McpServer, McpServerOptions, Scope, ToolOverrides, Transport};

use crate::LoomError;

/// Builds every declared MCP server (connections open lazily, when a run needs them).
pub(crate) fn servers(config: &Config) -> Result<BTreeMap<String, Arc<dyn ToolSource>>, LoomError> {
    let mut servers: BTreeMap<String, Arc<dyn ToolSource>> = BTreeMap::new();
    let mut shared: Option<Arc<Config>> = None;
    for (index, spec) in config.raw().mcp_servers.iter().enumerate() {
        let redirected = config.raw().tenants.iter().any(|tenant| {
            crate::secrets::redirects(
                config,
                &tenant.id,
                spec.headers_env.values().chain(spec.env_from.values()),
            )
        });
        if redirected {
            // Checked here as for the others, with values that cannot be secrets.
            options(config, index, spec, None)?;
            let config = shared.get_or_insert_with(|| Arc::new(config.clone()));
            servers.insert(
                spec.name.clone(),
                Arc::new(PerTenant {
                    config: config.clone(),
                    index,
                    name: spec.name.clone(),
                    servers: Mutex::new(BTreeMap::new()),
                    shut_down: std::sync::atomic::AtomicBool::new(false),
                }),
            );
        } else {
            let options = options(config, index, spec, Some(loom_config::DEFAULT_TENANT))?;
            servers.insert(spec.name.clone(), Arc::new(McpServer::new(options)));
        }
    }
    Ok(servers)
}

/// An MCP server whose secrets some tenant redirects: one [`McpServer`] per tenant, built with
/// the tenant's values ([`crate::secrets`]) the first time one of its runs opens it.
#[derive(Debug)]
struct PerTenant {
    config: Arc<Config>,
    index: usize,
    name: String,
    servers: Mutex<BTreeMap<String, Arc<McpServer>>>,
    /// Set by `shutdown`: no tenant's server is built any more.
    shut_down: std::sync::atomic::AtomicBool,
}

impl PerTenant {
    /// The server of `tenant`, built now if needed.
    fn server(&self, tenant: &str) -> Result<Arc<McpServer>, SourceError> {
        let mut servers = self
            .servers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(server) = servers.get(tenant) {
            return Ok(server.clone());
        }
        if self.shut_down.load(std::sync::atomic::Ordering::Acquire) {
            return Err(SourceError {
                message: format!("MCP server '{}' is shut down", self.name),
                circuit: None,
            });
        }
        let spec = &self.config.raw().mcp_servers[self.index];
        let options =
            options(&self.config, self.index, spec, Some(tenant)).map_err(|error| SourceError {
                message: error.to_string(),
                circuit: None,
            })?;
        let server = Arc::new(McpServer::new(options));
        servers.insert(tenant.to_owned(), server.clone());
        Ok(server)
    }

    fn built(&self, tenant: &str) -> Option<Arc<McpServer>> {
        self.servers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(tenant)
            .cloned()
    }
}

impl ToolSource for PerTenant {
    fn name(&self) -> &str {
        &self.name
    }

    fn open<'a>(
        &'a self,
        ctx: &'a SourceContext,
    ) -> BoxFuture<'a, Result<Vec<Arc<dyn Tool>>, SourceError>> {
        Box::pin(async move { self.server(&ctx.tenant_id)?.open(ctx).await })
    }

    fn release<'a>(&'a self, ctx: &'a SourceContext) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Some(server) = self.built(&ctx.tenant_id) {
                server.release(ctx).await;
            }
        })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        self.shut_down
            .store(true, std::sync::atomic::Ordering::Release);
        let servers: Vec<Arc<McpServer>> = self
            .servers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .cloned()
            .collect();
        Box::pin(async move {
            futures_util::future::join_all(servers.iter().map(|s| s.shutdown())).await;
        })
    }
}

/// The value of the secret `variable` named at `key`, for `tenant`; `None` checks the
/// configuration only (a placeholder that is no secret).
fn secret_value(
    config: &Config,
    tenant: Option<&str>,
    key: &str,
    variable: &str,
) -> Result<String, LoomError> {
    match tenant {
        Some(tenant) => crate::secrets::required(config, tenant, variable, key),
        None => Ok(String::new()),
    }
}

/// The options of server `index` for `tenant`'s runs (`None`: checked only, secrets left
/// empty).
fn options(
    config: &Config,
    index: usize,
    spec: &McpServerSpec,
    tenant: Option<&str>,
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
                    secret_value(config, tenant, &at(&format!("env_from.{name}")), variable)?,
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
        McpTransport::Http | McpTransport::Sse => {
            let mut headers = Vec::new();
            for (name, variable) in &spec.headers_env {
                headers.push((
                    name.clone(),
                    secret_value(
                        config,
                        tenant,
                        &at(&format!("headers_env.{name}")),
                        variable,
                    )?,
                ));
            }
            let url = spec.url.clone().unwrap_or_default();
            if spec.transport == McpTransport::Http {
                Transport::Http { url, headers }
            } else {
                Transport::Sse { url, headers }
            }
        }
    };
    let mut overrides = BTreeMap::new();
    for (tool, o) in &spec.tools {
        // `approval` is applied where an agent references the server (resolve/tools.rs),
        // with the agent's own declarations over it.
        // `output` contracts are bound where an agent references the server
        // (resolve/tools.rs), when a run opens it.
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
    if let Some(idle) = spec.idle_timeout {
        options.idle_timeout = Some(Duration::try_from_secs_f64(idle).map_err(|_| {
            LoomError::from(config.error_at_root(&at("idle_timeout"), "not a usable duration"))
        })?);
    }
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
