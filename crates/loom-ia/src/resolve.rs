//! From configuration and registered code to what the engine runs.
//!
//! Models are built once, when the configuration is loaded. Agents are resolved against the
//! registered tools when first used (or by [`crate::Loom::validate`]), so tools can be
//! registered after loading; every refusal names the file, line and key of the reference.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use loom_builtins::{FetchOptions, Folder, Right, Rights};
use loom_config::{Config, FolderRight, ModelSpec, Sdk};
use loom_core::{
    model::ModelClient,
    ports::ToolSource,
    tool::{Approval, OnUnknown, Tool, ToolDeclarations},
};
use loom_engine::{AgentRuntime, BoundSource, BoundTool, ModelBinding};

use crate::sources::AgentSource;
use loom_models::FakeModel;

use crate::LoomError;

/// Builds the client of every declared model.
pub(crate) fn models(config: &Config) -> Result<BTreeMap<String, Arc<dyn ModelClient>>, LoomError> {
    let mut clients: BTreeMap<String, Arc<dyn ModelClient>> = BTreeMap::new();
    for (index, spec) in config.raw().models.iter().enumerate() {
        let client: Arc<dyn ModelClient> = match spec.sdk {
            Sdk::Fake => {
                let model =
                    FakeModel::from_params(spec.model.clone(), &spec.params).map_err(|e| {
                        config.error_at_root(
                            &format!("models[{index}].params.script{}", e.path),
                            e.message,
                        )
                    })?;
                Arc::new(model)
            }
            Sdk::Anthropic | Sdk::Openai => {
                let sdk = spec.sdk.as_str();
                let compiled = match spec.sdk {
                    Sdk::Anthropic => cfg!(feature = "anthropic"),
                    _ => cfg!(feature = "openai"),
                };
                let message = if compiled {
                    format!(
                        "model '{}': the '{sdk}' adapter is not part of this version yet",
                        spec.id
                    )
                } else {
                    format!(
                        "model '{}': sdk '{sdk}' needs the Cargo feature '{sdk}' of loom-ia, \
                         which this build does not have",
                        spec.id
                    )
                };
                return Err(config
                    .error_at_root(&format!("models[{index}].sdk"), message)
                    .into());
            }
        };
        clients.insert(spec.id.clone(), client);
    }
    Ok(clients)
}

/// Resolves an agent for a tenant: rendered prompt, model binding, bound tools.
pub(crate) fn agent(
    config: &Config,
    models: &BTreeMap<String, Arc<dyn ModelClient>>,
    tools: &BTreeMap<String, Arc<dyn Tool>>,
    sources: &BTreeMap<String, Arc<dyn ToolSource>>,
    name: &str,
    tenant: &str,
) -> Result<AgentRuntime, LoomError> {
    let Some(spec) = config.agent(name) else {
        let known: Vec<&str> = config.agents().iter().map(|a| a.name.as_str()).collect();
        return Err(LoomError::UnknownAgent {
            name: name.to_owned(),
            known: if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            },
        });
    };
    let model_spec: &ModelSpec = config.model(&spec.main.model).ok_or_else(|| {
        config.error_at_agent(
            name,
            "main.model",
            format!("unknown model '{}'", spec.main.model),
        )
    })?;
    let client = models.get(&model_spec.id).cloned().ok_or_else(|| {
        config.error_at_agent(
            name,
            "main.model",
            format!("model '{}' has no client", model_spec.id),
        )
    })?;
    if !spec.tools.is_empty() && !model_spec.capabilities.tools {
        return Err(config
            .error_at_agent(
                name,
                "main.model",
                format!("model '{}' cannot call tools (capabilities.tools: false) but the agent has tools", model_spec.id),
            )
            .into());
    }
    let mut params = model_spec.params.clone();
    for (key, value) in &spec.main.llm.params {
        params.insert(key.clone(), value.clone());
    }
    let execution = &config.raw().execution.tools;
    let mut bound: Vec<BoundTool> = Vec::with_capacity(spec.tools.len());
    let mut bound_sources: Vec<BoundSource> = Vec::new();
    for (index, reference) in spec.tools.iter().enumerate() {
        let at = |key: &str, message: String| {
            LoomError::from(config.error_at_agent(name, &format!("tools[{index}].{key}"), message))
        };
        if let Some(server) = &reference.mcp {
            let Some(source) = sources.get(server) else {
                return Err(at("mcp", format!("unknown MCP server '{server}'")));
            };
            for (tool, overrides) in &reference.tools {
                if overrides.approval.is_some_and(|a| a != Approval::Never) {
                    return Err(at(
                        &format!("tools.{tool}.approval"),
                        APPROVAL_NOT_YET.to_owned(),
                    ));
                }
            }
            let agent_source = AgentSource::new(
                source.clone(),
                server,
                reference.alias.as_deref(),
                reference.include.clone(),
                reference.exclude.clone(),
                reference.tools.clone(),
            );
            bound_sources.push(BoundSource {
                source: Arc::new(agent_source),
                required: reference.required,
            });
            continue;
        }
        let tool_name = reference.tool.clone().unwrap_or_default();
        let tool: Arc<dyn Tool> = if tool_name.starts_with("loom.") {
            builtins(config, &tool_name, reference).map_err(|message| at("tool", message))?
        } else {
            let Some(tool) = tools.get(&tool_name) else {
                let registered: Vec<&str> = tools.keys().map(String::as_str).collect();
                let registered = if registered.is_empty() {
                    "none".to_owned()
                } else {
                    registered.join(", ")
                };
                return Err(at(
                    "tool",
                    format!("unknown tool '{tool_name}' (registered tools: {registered})"),
                ));
            };
            tool.clone()
        };
        let tool = &tool;
        if bound.iter().any(|b| b.name() == tool.spec().name) {
            return Err(at("tool", format!("tool '{tool_name}' is listed twice")));
        }
        let mut declarations: ToolDeclarations = tool.spec().declarations.clone();
        if let Some(side_effects) = reference.side_effects {
            declarations.side_effects = side_effects;
        }
        if let Some(approval) = reference.approval {
            declarations.approval = approval;
        }
        if let Some(idempotent) = reference.idempotent {
            declarations.idempotent = idempotent;
        }
        if let Some(timeout) = reference.timeout {
            let timeout = seconds(timeout)
                .ok_or_else(|| at("timeout", format!("{timeout} s is not a usable duration")))?;
            declarations.timeout = Some(timeout);
        }
        if let Some(offload_over) = reference.offload_over {
            declarations.offload_over = Some(offload_over);
        }
        let from_yaml = |yaml: bool, key: &'static str| if yaml { key } else { "tool" };
        if declarations.approval != Approval::Never {
            return Err(at(
                from_yaml(reference.approval.is_some(), "approval"),
                format!("tool '{tool_name}' requires human approval: {APPROVAL_NOT_YET}"),
            ));
        }
        if declarations.on_unknown == OnUnknown::Pause {
            return Err(at(
                "tool",
                format!(
                    "tool '{}' declares on_unknown: pause, which needs human approvals (not implemented yet)",
                    tool_name
                ),
            ));
        }
        let description = reference
            .description
            .clone()
            .unwrap_or_else(|| tool.spec().description.clone());
        let bound_tool = BoundTool::new(tool.clone(), declarations, description)
            .map_err(|e| at("tool", e.to_string()))?;
        bound.push(bound_tool);
    }
    Ok(AgentRuntime {
        name: spec.name.clone(),
        system: config.render_system(name, tenant)?,
        main: ModelBinding {
            config_id: model_spec.id.clone(),
            model_id: model_spec.model.clone(),
            client,
            pricing: model_spec.pricing.clone(),
            max_tokens: spec.main.llm.max_tokens.or(model_spec.max_tokens),
            params,
        },
        tools: bound,
        sources: bound_sources,
        offload_over: execution.offload_over,
        max_iterations: spec.max_iterations,
        timeout: match spec.timeout {
            Some(secs) => Some(seconds(secs).ok_or_else(|| {
                config.error_at_agent(
                    name,
                    "timeout",
                    format!("{secs} s is not a usable duration"),
                )
            })?),
            None => None,
        },
        tool_timeout: match execution.timeout {
            Some(secs) => Some(seconds(secs).ok_or_else(|| {
                config.error_at_root("execution.tools.timeout", "not a usable duration")
            })?),
            None => None,
        },
        validate_arguments: execution.validate_arguments,
    })
}

/// Why an approval declaration is refused in this version.
pub(crate) const APPROVAL_NOT_YET: &str = "human approval is not available in this version yet (durable approvals are not implemented); use approval: never";

/// A built-in tool (`tool: loom.<name>`) with its parameters.
fn builtins(
    config: &Config,
    name: &str,
    reference: &loom_config::ToolRef,
) -> Result<Arc<dyn Tool>, String> {
    match name {
        "loom.current_datetime" => Ok(Arc::new(loom_builtins::current_datetime(Arc::new(
            crate::SystemClock,
        )))),
        "loom.local_files" => {
            let mut folders = Vec::new();
            for folder in reference.folders.iter().flatten() {
                let rights = Rights::list(folder.rights.iter().map(|right| match right {
                    FolderRight::Read => Right::Read,
                    FolderRight::Write => Right::Write,
                    FolderRight::Overwrite => Right::Overwrite,
                    FolderRight::Delete => Right::Delete,
                }));
                let needing: Vec<&str> = rights
                    .needing_approval()
                    .into_iter()
                    .map(Right::as_str)
                    .collect();
                if !needing.is_empty() {
                    return Err(format!(
                        "folder '{}': the rights {} need human approval by default, which this version \
                         cannot provide yet; grant read and write only",
                        folder.name,
                        needing.join(", ")
                    ));
                }
                folders.push(Folder::new(
                    folder.name.clone(),
                    config.base_dir().join(&folder.path),
                    rights,
                ));
            }
            loom_builtins::local_files(folders)
                .map(|t| Arc::new(t) as Arc<dyn Tool>)
                .map_err(|e| e.to_string())
        }
        "loom.fetch_page" => {
            let defaults = FetchOptions::default();
            Ok(Arc::new(loom_builtins::fetch_page(FetchOptions {
                allow_private: reference.allow_private.unwrap_or(false),
                max_bytes: reference.max_bytes.unwrap_or(defaults.max_bytes),
                ..defaults
            })))
        }
        other => Err(format!("unknown built-in tool '{other}'")),
    }
}

/// A positive number of seconds as a duration, `None` when it cannot be one (too large).
fn seconds(secs: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
}
